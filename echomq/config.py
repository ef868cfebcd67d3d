"""Per-queue settings: one frozen dataclass, shared by producers and consumers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from echomq.backoff import Backoff
from echomq.errors import ConfigError

DURABILITIES = ("volatile", "folded", "sync", "durable")
DOORBELLS = ("list", "marker")  # what consumers park on: BLPOP wake, or BZPOPMIN marker
# how long a stop lets running jobs finish (the supervisor's --drain-timeout, a standalone
# Consumer's drain_timeout): below Kubernetes' default 30 s grace period
DEFAULT_DRAIN_TIMEOUT_S = 25.0

# a lane's active count carries its blocked flag as + 10^9 (claim.lua): limits stay below
MAX_LIMIT = 999_999_999
# payloads nest at most this deep, whatever the setting: a consumer decodes them with
# Python's recursion limit (1000 frames) less the frames of its own stack
MAX_PAYLOAD_DEPTH = 500


@dataclass(frozen=True)
class QueueSettings:
    """How a queue admits, leases, retries and retains jobs.

    ``max_payload_bytes`` bounds a payload's encoded size (512 KiB), ``max_payload_depth``
    how deep its arrays and objects nest (100; at most 500), so every consumer can decode
    it; a handler's result past either is kept as a note saying so instead.
    ``keep_completed`` bounds how many completed jobs keep their hash (0 drops
    them at once, None keeps all); ``keep_completed_s`` drops those older than
    that many seconds; ``keep_dead`` and ``keep_dead_s`` do the same for dead jobs
    (trimmed by the supervisor's metronome). ``claim_batch`` is how many jobs one
    claim may lease. ``admit_call_bytes`` bounds the payload bytes ``add_many`` sends
    in one script call. ``doorbell`` is what consumers park on (``list`` or
    ``marker``, see echomq.wake). ``concurrency`` is how many jobs a consumer runs at
    once (coroutines for async handlers, threads for sync ones); ``job_timeout`` the
    default per-job limit in seconds (a job's own ``timeout`` overrides it).
    ``lane_limit`` is the queue's default max_active per lane, recorded on the server by
    a consumer or supervisor that starts with it (None leaves the recorded default as it
    is; see ``Queue.set_lane_limit``).
    """

    max_payload_bytes: int = 512 * 1024
    max_payload_depth: int = 100
    max_attempts: int = 3
    max_stalls: int = 1
    backoff: Backoff = field(default_factory=Backoff)
    lease_ms: int = 30_000
    beat_ms: int = 1000
    pump_batch: int = 100
    claim_batch: int = 16
    keep_completed: int | None = 1000
    keep_completed_s: float | None = 24 * 3600.0
    durability: str | None = None
    keep_dead: int | None = 10_000
    keep_dead_s: float | None = 30 * 24 * 3600.0
    admit_call_bytes: int = 8 * 1024 * 1024
    doorbell: str = "list"
    concurrency: int = 1
    job_timeout: float | None = None
    lane_limit: int | None = None

    def __post_init__(self) -> None:
        checks = (
            (self.max_payload_bytes >= 1, "max_payload_bytes must be >= 1"),
            (isinstance(self.max_payload_depth, int)
             and not isinstance(self.max_payload_depth, bool)
             and 1 <= self.max_payload_depth <= MAX_PAYLOAD_DEPTH,
             f"max_payload_depth must be an integer from 1 to {MAX_PAYLOAD_DEPTH}"),
            (self.max_attempts >= 1, "max_attempts must be >= 1"),
            (self.max_stalls >= 0, "max_stalls must be >= 0"),
            (self.lease_ms >= 100, "lease_ms must be >= 100"),
            (self.beat_ms >= 10, "beat_ms must be >= 10"),
            (self.pump_batch >= 1, "pump_batch must be >= 1"),
            (self.claim_batch >= 1, "claim_batch must be >= 1"),
            (self.keep_completed is None or self.keep_completed >= 0,
             "keep_completed must be >= 0 or None"),
            (self.keep_completed_s is None or self.keep_completed_s >= 0,
             "keep_completed_s must be >= 0 or None"),
            (self.keep_dead is None or self.keep_dead >= 0, "keep_dead must be >= 0 or None"),
            (self.keep_dead_s is None or self.keep_dead_s >= 0,
             "keep_dead_s must be >= 0 or None"),
            (self.admit_call_bytes >= 1, "admit_call_bytes must be >= 1"),
            (isinstance(self.concurrency, int) and 1 <= self.concurrency <= 10_000,
             "concurrency must be an integer from 1 to 10000"),
            (self.job_timeout is None or 0 < self.job_timeout < float("inf"),
             "job_timeout must be a number of seconds > 0 or None"),
            (self.lane_limit is None or (isinstance(self.lane_limit, int)
                                         and not isinstance(self.lane_limit, bool)
                                         and 1 <= self.lane_limit <= MAX_LIMIT),
             f"lane_limit must be an integer from 1 to {MAX_LIMIT:,} or None"),
            (self.durability is None or self.durability in DURABILITIES,
             f"durability must be one of {', '.join(DURABILITIES)}"),
            (self.doorbell in DOORBELLS, f"doorbell must be one of {', '.join(DOORBELLS)}"),
        )
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if not isinstance(self.backoff, Backoff):
            coerced = Backoff.coerce(self.backoff)
            object.__setattr__(self, "backoff", coerced or Backoff())

    def with_overrides(self, **overrides: Any) -> QueueSettings:
        """A copy with some fields replaced; unknown names raise ConfigError."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = set(overrides) - names
        if unknown:
            raise ConfigError(f"unknown queue setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **overrides) if overrides else self

    @property
    def retention_args(self) -> tuple[int, int]:
        """(keep_count, keep_age_ms) as the settle script takes them; -1 means no limit."""
        count = -1 if self.keep_completed is None else self.keep_completed
        age = -1 if self.keep_completed_s is None else int(self.keep_completed_s * 1000)
        return count, age

    @property
    def dead_retention_args(self) -> tuple[int, int]:
        """(keep_count, keep_age_ms) for trim_dead.lua; -1 means no limit."""
        count = -1 if self.keep_dead is None else self.keep_dead
        age = -1 if self.keep_dead_s is None else int(self.keep_dead_s * 1000)
        return count, age
