"""Supervisor settings: one frozen dataclass, read from flags or ``ECHOMQ_*`` variables.

Every command-line flag has an environment variable of the same meaning, so one
container image runs under Kubernetes with env only. ``ENV_VARS`` is the single
table of those names; the deploy manifests are checked against it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from echomq.config import DEFAULT_DRAIN_TIMEOUT_S, DOORBELLS
from echomq.errors import ConfigError

# flag (without dashes, underscores) -> environment variable
ENV_VARS: dict[str, str] = {
    "redis_url": "ECHOMQ_REDIS_URL",
    "queue": "ECHOMQ_QUEUE",
    "handler": "ECHOMQ_HANDLER",
    "tasks": "ECHOMQ_TASKS",
    "processes": "ECHOMQ_PROCESSES",
    "floor_url": "ECHOMQ_FLOOR_URL",
    "outbox_url": "ECHOMQ_OUTBOX_URL",
    "durability": "ECHOMQ_DURABILITY",
    "beat_ms": "ECHOMQ_BEAT_MS",
    "lease_ms": "ECHOMQ_LEASE_MS",
    "drain_timeout": "ECHOMQ_DRAIN_TIMEOUT",
    "boot_timeout": "ECHOMQ_BOOT_TIMEOUT",
    "health_port": "ECHOMQ_HEALTH_PORT",
    "health_host": "ECHOMQ_HEALTH_HOST",
    "max_memory_mb": "ECHOMQ_MAX_MEMORY_MB",
    "max_jobs": "ECHOMQ_MAX_JOBS",
    "concurrency": "ECHOMQ_CONCURRENCY",
    "job_timeout": "ECHOMQ_JOB_TIMEOUT",
    "lane_limit": "ECHOMQ_LANE_LIMIT",
    "spill_horizon": "ECHOMQ_SPILL_HORIZON",
    "keep_dead": "ECHOMQ_KEEP_DEAD",
    "keep_dead_s": "ECHOMQ_KEEP_DEAD_S",
    "log_json": "ECHOMQ_LOG_JSON",
    "log_level": "ECHOMQ_LOG_LEVEL",
    "config": "ECHOMQ_CONFIG",
    "doorbell": "ECHOMQ_DOORBELL",
    "switch_doorbell": "ECHOMQ_SWITCH_DOORBELL",
    "dashboard": "ECHOMQ_DASHBOARD",
    "dashboard_actions": "ECHOMQ_DASHBOARD_ACTIONS",
    "middleware": "ECHOMQ_MIDDLEWARE",
}

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SPILL_HORIZON_S = 3600.0
DEFAULT_BOOT_TIMEOUT_S = 60.0  # a consumer not READY by then is ended and forked again
DURABILITIES = ("volatile", "folded", "sync", "durable")


@dataclass(frozen=True)
class QueueSpec:
    """One queue served by the supervisor: its handler and how many processes run it.

    ``tasks``: modules whose registered tasks on this queue run by job name; with a
    ``handler`` too, jobs no task claims go to the handler.
    """

    name: str
    handler: str
    processes: int = 1
    durability: str | None = None  # None: "folded" with a floor, "volatile" without
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    """Everything ``echomq-supervisor start`` needs, already validated."""

    redis_url: str = DEFAULT_REDIS_URL
    queues: tuple[QueueSpec, ...] = ()
    floor_url: str | None = None
    outbox_url: str | None = None  # the outbox's database when not the floor's
    beat_ms: int = 1000
    lease_ms: int = 30000
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT_S
    health_port: int | None = None
    health_host: str = "0.0.0.0"
    max_memory_mb: int | None = None
    max_jobs: int | None = None
    concurrency: int = 1
    job_timeout: float | None = None
    lane_limit: int | None = None  # the queues' default max_active per lane
    spill_horizon: float = DEFAULT_SPILL_HORIZON_S
    keep_dead: int = 10_000  # dead jobs kept per queue (their hashes hold payload and error)
    keep_dead_s: float = 30 * 24 * 3600.0
    log_json: bool = False
    log_level: str = "INFO"
    doorbell: str = "list"
    switch_doorbell: bool = False
    dashboard: bool = False  # serve the dashboard at / of the health port
    dashboard_actions: bool = False  # ... with retry/cancel/pause buttons
    middleware: tuple[str, ...] = ()  # MODULE:NAME of echomq.Middleware, built in each consumer
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.beat_ms < 10:
            raise ConfigError(f"beat_ms must be >= 10, got {self.beat_ms}")
        if self.lease_ms < 100:
            raise ConfigError(f"lease_ms must be >= 100, got {self.lease_ms}")
        if self.keep_dead < 0 or self.keep_dead_s < 0:
            raise ConfigError("keep_dead and keep_dead_s must be >= 0")
        if self.drain_timeout < 0:
            raise ConfigError(f"drain_timeout must be >= 0, got {self.drain_timeout}")
        if not 0 < self.boot_timeout < float("inf"):
            raise ConfigError(f"boot_timeout must be > 0 seconds, got {self.boot_timeout}")
        if self.doorbell not in DOORBELLS:
            raise ConfigError(f"doorbell must be one of {', '.join(DOORBELLS)}, "
                              f"got {self.doorbell!r}")
        if not 1 <= self.concurrency <= 10_000:
            raise ConfigError(f"concurrency must be from 1 to 10000, got {self.concurrency}")
        if self.job_timeout is not None and not 0 < self.job_timeout < float("inf"):
            raise ConfigError(f"job_timeout must be > 0 seconds, got {self.job_timeout}")
        if self.lane_limit is not None and self.lane_limit < 1:
            raise ConfigError(f"lane_limit must be >= 1, got {self.lane_limit}")
        for spec in self.queues:
            if spec.processes < 1:
                raise ConfigError(f"queue {spec.name!r}: processes must be >= 1")
            if spec.durability is not None and spec.durability not in DURABILITIES:
                raise ConfigError(
                    f"queue {spec.name!r}: durability must be one of {', '.join(DURABILITIES)}"
                )
            if spec.durability in ("folded", "sync", "durable") and not self.floor_url:
                raise ConfigError(
                    f"queue {spec.name!r}: durability {spec.durability!r} needs --floor-url"
                )

    def durability_of(self, spec: QueueSpec) -> str:
        """The effective durability dial of one queue."""
        if spec.durability is not None:
            return spec.durability
        return "folded" if self.floor_url else "volatile"


def env_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The environment value for a flag name (``beat_ms``), or None when unset or empty."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_VARS[name])
    return value if value not in (None, "") else None


def parse_bool(text: str) -> bool:
    """Read a boolean flag from the environment ("1", "true", "yes", "on")."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"not a boolean: {text!r}")
