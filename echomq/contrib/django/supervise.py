"""``manage.py echomq_supervisor``: the supervisor's command line with the project's settings
filled in (and :class:`~echomq.contrib.django.middleware.CloseOldConnections` in every
consumer), run in the process where Django is set up, so every consumer it forks has the
apps, models and settings loaded once, before the fork."""

from __future__ import annotations

import os
from collections.abc import Sequence

from django.apps import apps
from django.db import connections

from echomq.contrib.django.apps import echo_settings
from echomq.contrib.django.conf import EchoSettings, task_modules
from echomq.contrib.django.middleware import TARGET as CLOSE_OLD_CONNECTIONS

SUBCOMMANDS = ("start", "migrate", "drill")


def supervisor_argv(args: Sequence[str], echo: EchoSettings,
                    app_modules: Sequence[str]) -> list[str]:
    """The ``echomq-supervisor`` arguments: ``start`` unless another subcommand is named,
    then the settings' values for the options the command line does not give."""
    args = list(args)
    command = args.pop(0) if args and args[0] in SUBCOMMANDS else "start"
    given = set(_flags(args))
    extra = list(echo.supervisor)
    given |= set(_flags(extra))
    filled: list[str] = []
    if command == "start":
        if echo.redis_url and "--redis-url" not in given:
            filled += ["--redis-url", echo.redis_url]
        if echo.floor and "--floor-url" not in given:
            filled += ["--floor-url", echo.floor]
        if "--tasks" not in given:
            modules = task_modules(echo, app_modules)
            if modules:
                filled += ["--tasks", ",".join(modules)]
        if echo.queues and "--queue" not in given:
            filled += ["--queue", ",".join(echo.queues)]
        # Django's connections checked around every job (added to any --middleware given;
        # ECHOMQ_MIDDLEWARE, which a --middleware flag would hide, is carried over)
        filled += ["--middleware", CLOSE_OLD_CONNECTIONS]
        if "--middleware" not in given and os.environ.get("ECHOMQ_MIDDLEWARE"):
            filled += ["--middleware", os.environ["ECHOMQ_MIDDLEWARE"]]
        return [command, *filled, *extra, *args]
    if command == "migrate" and echo.floor and "--floor-url" not in given:
        filled += ["--floor-url", echo.floor]
    return [command, *filled, *args]


def close_connections() -> None:
    """Close this thread's database connections: a forked consumer opens its own."""
    connections.close_all()


def run_supervisor(args: Sequence[str]) -> int:
    """Run ``echomq-supervisor`` with ``args`` (see :func:`supervisor_argv`); its exit code."""
    from echomq.supervisor.cli import main

    echo = echo_settings()
    if echo.admit == "outbox":
        # the relay reads the project's database (in the environment: no password in argv);
        # --outbox-url or ECHOMQ_OUTBOX_URL, when given, win
        from echomq.contrib.django.outbox import database_url

        url = database_url(connections[echo.database].settings_dict)
        if url:
            os.environ.setdefault("ECHOMQ_OUTBOX_URL", url)
    argv = supervisor_argv(args, echo, [a.name for a in apps.get_app_configs()])
    # no connection may cross a fork: the parent's socket would be shared by two processes
    close_connections()
    os.register_at_fork(before=close_connections)
    return int(main(argv))


def _flags(args: Sequence[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]
