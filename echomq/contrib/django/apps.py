"""The Django app: reads ``settings.ECHOMQ`` and installs the commit-time admit."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings

from echomq import deferral, pools
from echomq.contrib.django import conf
from echomq.contrib.django.commit import at_commit


class EchoMQConfig(AppConfig):  # type: ignore[misc]  # Django has no type hints
    """``INSTALLED_APPS += ["echomq.contrib.django"]``."""

    name = "echomq.contrib.django"
    label = "echomq"
    verbose_name = "EchoMQ"
    echo: conf.EchoSettings

    def ready(self) -> None:
        """Check ``settings.ECHOMQ``, set the default server, install the commit-time admit
        (or the outbox)."""
        self.echo = conf.parse(getattr(settings, "ECHOMQ", None))
        if self.echo.redis_url is not None or self.echo.defaults:
            pools.configure(redis_url=self.echo.redis_url, defaults=self.echo.defaults)
        if self.echo.admit == "outbox":
            from echomq.contrib.django.outbox import in_outbox

            deferral.set_outboxer(in_outbox(self.echo.database))
        if self.echo.admit in ("on_commit", "outbox"):
            # "outbox": jobs the outbox cannot carry (after=, expires=) wait for the commit
            deferral.set_deferrer(at_commit(self.echo.database))


def echo_settings() -> conf.EchoSettings:
    """The checked ``settings.ECHOMQ`` of the running project."""
    from django.apps import apps

    config = apps.get_app_config("echomq")
    assert isinstance(config, EchoMQConfig)
    return config.echo
