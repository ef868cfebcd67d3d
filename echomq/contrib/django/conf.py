"""``settings.ECHOMQ``, read and checked once, when the app is ready.

Keys (all optional):

- ``REDIS_URL``: the server (default: ``ECHOMQ_REDIS_URL``, else the local default).
- ``FLOOR``: the SQL floor's URL, for ``manage.py echomq_supervisor`` (``--floor-url``).
- ``TASKS``: modules of ``@echomq.task`` functions (default: the ``tasks`` module of every
  installed app that has one).
- ``QUEUES``: the queues ``echomq_supervisor`` runs (default: every queue the tasks name).
- ``ADMIT``: when an add inside a transaction is admitted: ``"on_commit"`` (default: at
  commit, nothing on rollback), ``"outbox"`` (written into the outbox table in the
  transaction itself, admitted by the supervisor's relay once committed: see
  :mod:`echomq.contrib.django.outbox`), ``"immediate"`` (at once, whatever the
  transaction).
- ``DATABASE``: the database alias whose transactions count (default ``"default"``).
- ``SUPERVISOR``: more ``echomq-supervisor start`` arguments, e.g. ``["--processes", "2"]``
  (the command line's own arguments come after these and win).
- ``DASHBOARD_STAFF_ONLY``: the dashboard view asks for a staff user (default True; else
  any signed-in user).
- ``DEFAULTS``: queue settings (``max_attempts``, ``backoff``, ``keep_completed``...) of
  every Queue, aio.Queue and task the project makes without its own (``echomq.configure``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from echomq.config import QueueSettings
from echomq.errors import ConfigError

ADMIT_MODES = ("on_commit", "immediate", "outbox")
KNOWN = {"REDIS_URL", "FLOOR", "TASKS", "QUEUES", "ADMIT", "DATABASE", "SUPERVISOR",
         "DASHBOARD_STAFF_ONLY", "DEFAULTS"}


@dataclass(frozen=True)
class EchoSettings:
    """``settings.ECHOMQ`` as checked values."""

    redis_url: str | None = None
    floor: str | None = None
    tasks: tuple[str, ...] | None = None
    queues: tuple[str, ...] = ()
    admit: str = "on_commit"
    database: str = "default"
    supervisor: tuple[str, ...] = field(default_factory=tuple)
    dashboard_staff_only: bool = True
    defaults: dict[str, Any] = field(default_factory=dict)


def parse(raw: Any) -> EchoSettings:
    """Check ``settings.ECHOMQ``; a ConfigError names the key that is wrong."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"settings.ECHOMQ must be a dict, got {type(raw).__name__}")
    unknown = set(raw) - KNOWN
    if unknown:
        raise ConfigError(f"settings.ECHOMQ: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(KNOWN))}")
    admit = raw.get("ADMIT", "on_commit")
    if admit not in ADMIT_MODES:
        raise ConfigError(f"settings.ECHOMQ['ADMIT'] must be one of {', '.join(ADMIT_MODES)}, "
                          f"got {admit!r}")
    tasks = raw.get("TASKS")
    defaults = raw.get("DEFAULTS", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"settings.ECHOMQ['DEFAULTS'] must be a dict of queue settings, "
                          f"got {defaults!r}")
    try:
        QueueSettings().with_overrides(**defaults)
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"settings.ECHOMQ['DEFAULTS']: {exc}") from None
    return EchoSettings(
        redis_url=_optional_str(raw, "REDIS_URL"),
        floor=_optional_str(raw, "FLOOR"),
        tasks=None if tasks is None else _names(tasks, "TASKS"),
        queues=_names(raw.get("QUEUES", ()), "QUEUES"),
        admit=admit,
        database=_optional_str(raw, "DATABASE") or "default",
        supervisor=_names(raw.get("SUPERVISOR", ()), "SUPERVISOR"),
        dashboard_staff_only=bool(raw.get("DASHBOARD_STAFF_ONLY", True)),
        defaults=dict(defaults),
    )


def task_modules(settings: EchoSettings, app_modules: Sequence[str]) -> list[str]:
    """``TASKS``, else the ``<app>.tasks`` modules of the installed apps that have one."""
    if settings.tasks is not None:
        return list(settings.tasks)
    found = []
    for app in app_modules:
        name = f"{app}.tasks"
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except ModuleNotFoundError:
            continue
    return found


def _optional_str(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"settings.ECHOMQ[{key!r}] must be a non-empty string, got {value!r}")
    return value


def _names(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple) or not all(
            isinstance(v, str) and v for v in value):
        raise ConfigError(f"settings.ECHOMQ[{key!r}] must be a list of strings, got {value!r}")
    return tuple(value)
