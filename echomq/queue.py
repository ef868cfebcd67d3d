"""The producer side: admit jobs, look them up, count them, re-admit dead ones."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis

from echomq import scripts
from echomq.backoff import Backoff
from echomq.config import QueueSettings
from echomq.connection import (
    DEFAULT_URL,
    client_from_url,
    describe,
    redact_url,
    translated,
    wait_replicas,
)
from echomq.errors import InvalidName, InvalidSchedule, NotReplicated, PayloadError
from echomq.job import STATES, Job
from echomq.keys import DEFAULT_LANE, Keys, validate_job_id, validate_name

ADMIT_BATCH = 500  # jobs per script call in add_many: bounds one script's run time
REPLICA_WAIT_MS = 1000  # durability "sync": how long an admit waits for a replica's ack


class Queue:
    """A named queue on a Valkey/Redis server.

    ``Queue("emails", redis_url="redis://...")`` or ``Queue("emails", redis=client)``.
    Settings come from ``settings=QueueSettings(...)`` and/or keyword overrides
    (``Queue("q", max_payload_bytes=4096)``).
    """

    def __init__(
        self,
        name: str,
        redis_url: str | None = None,
        *,
        redis: redis.Redis | None = None,
        settings: QueueSettings | None = None,
        floor: Any = None,
        **overrides: Any,
    ) -> None:
        self.name = validate_name(name)
        self.floor = floor  # an echomq.floor.Floor: with durability "sync", add() writes it
        self.keys = Keys(name)
        self.settings = (settings or QueueSettings()).with_overrides(**overrides)
        if redis is not None:
            self.redis = redis
            self.where = describe(redis)
        else:
            url = redis_url or DEFAULT_URL
            self.redis = client_from_url(url)
            self.where = redact_url(url)

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, {self.where})"

    # --- admitting -----------------------------------------------------------

    def add(
        self,
        name: str,
        payload: Any = None,
        *,
        lane: str | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        job_id: str | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | float | None = None,
    ) -> str:
        """Admit one job and return its id (the same id again for a repeated ``job_id``)."""
        spec = self._spec(name, payload, lane, delay, run_at, job_id, max_attempts, backoff)
        [(script, keys, args)] = self._calls([spec])
        with translated(self.where):
            script(self.redis, keys, args)
        self.after_admit([spec])
        return spec[0]

    def add_many(self, jobs: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[str]:
        """Admit many jobs in one round trip; each is ``(name, payload)``,
        ``(name, payload, options)`` or a mapping of :meth:`add`'s arguments.

        Every job is validated before anything is sent, so a bad one admits none.
        """
        specs = self.specs(jobs)
        if specs:
            with translated(self.where):
                scripts.execute(self.redis, self._calls(specs))
            self.after_admit(specs)
        return [s[0] for s in specs]

    def specs(self, jobs: Iterable[Sequence[Any] | Mapping[str, Any]]
              ) -> list[tuple[str, list[Any], int | None]]:
        """Validate jobs given as :meth:`add_many` takes them (nothing is sent)."""
        specs = []
        for item in jobs:
            if isinstance(item, Mapping):
                opts = dict(item)
                name = opts.pop("name", None)
                payload = opts.pop("payload", None)
            else:
                if not 1 <= len(item) <= 3:
                    raise ValueError(f"a job is (name, payload[, options]), got {item!r}")
                name = item[0]
                payload = item[1] if len(item) > 1 else None
                opts = dict(item[2]) if len(item) > 2 else {}
            unknown = set(opts) - {"lane", "delay", "run_at", "job_id", "max_attempts", "backoff"}
            if unknown:
                raise ValueError(f"unknown job option(s): {', '.join(sorted(unknown))}")
            specs.append(self._spec(name, payload, opts.get("lane"), opts.get("delay"),
                                    opts.get("run_at"), opts.get("job_id"),
                                    opts.get("max_attempts"), opts.get("backoff")))
        return specs

    def after_admit(self, specs: Sequence[tuple[str, list[Any], int | None]]) -> None:
        """Durability "sync": the admits are on a replica and deferred jobs on the floor."""
        self._replicate()
        self._sync_to_floor(specs)

    def _replicate(self) -> None:
        """Durability "sync": ``WAIT 1`` on the queue's node, where it has a replica, so an
        acknowledged admit survives that node's failover. Raises NotReplicated when no
        replica confirmed within ``REPLICA_WAIT_MS``: the job may or may not survive one."""
        if self.settings.durability != "sync":
            return
        with translated(self.where):
            acked = wait_replicas(self.redis, self.keys.acks, 1, REPLICA_WAIT_MS)
        if acked == 0:
            raise NotReplicated(f"queue {self.name}: no replica confirmed the admit within "
                                f"{REPLICA_WAIT_MS} ms at {self.where}")

    def _sync_to_floor(self, specs: Sequence[tuple[str, list[Any], int | None]]) -> None:
        """Durability "sync": deferred jobs are on the floor before add() returns."""
        if self.settings.durability != "sync" or self.floor is None:
            return
        from echomq.floor.writethrough import write_through

        ids = [s[0] for s in specs if s[2] is not None]
        with translated(self.where):
            write_through(self.redis, self.keys, self.floor, ids)

    def _spec(self, name: Any, payload: Any, lane: str | None, delay: float | None,
              run_at: datetime | None, job_id: str | None, max_attempts: int | None,
              backoff: Backoff | float | None) -> tuple[str, list[Any], int | None]:
        """Validate one job: (id, admit args without the due, due arg or None)."""
        if not isinstance(name, str) or not name or len(name) > 255:
            raise InvalidName(f"invalid job name {name!r}: a non-empty string of at most 255 chars")
        lane = validate_name(lane, "lane name") if lane is not None else DEFAULT_LANE
        job_id = validate_job_id(job_id) if job_id is not None else uuid.uuid4().hex
        attempts = self.settings.max_attempts if max_attempts is None else max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        coerced = Backoff.coerce(backoff)
        encoded = self.encode_payload(payload)
        due = self._due(delay, run_at)
        args = [job_id, name, encoded, lane, attempts, self.settings.max_stalls,
                coerced.encode() if coerced else ""]
        return job_id, args, due

    def _due(self, delay: float | None, run_at: datetime | None) -> int | None:
        """The schedule script's due argument: -delay_ms, absolute ms, or None for now."""
        if delay is not None and run_at is not None:
            raise InvalidSchedule("give delay or run_at, not both")
        if run_at is not None:
            if not isinstance(run_at, datetime):
                raise InvalidSchedule(f"run_at must be a datetime, got {type(run_at).__name__}")
            if run_at.tzinfo is None or run_at.utcoffset() is None:
                raise InvalidSchedule("run_at must be timezone-aware, not naive")
            return max(0, int(run_at.timestamp() * 1000))
        if delay is None:
            return None
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or math.isnan(delay):
            raise InvalidSchedule(f"delay must be a number of seconds, got {delay!r}")
        if delay < 0 or math.isinf(delay):
            raise InvalidSchedule(f"delay must be a finite number of seconds >= 0, got {delay!r}")
        ms = int(delay * 1000)
        return None if ms == 0 else -ms

    def encode_payload(self, payload: Any) -> str:
        """JSON-encode a payload, enforcing the size limit; raise PayloadError otherwise."""
        try:
            text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
        size = len(text.encode())
        if size > self.settings.max_payload_bytes:
            raise PayloadError(
                f"payload is {size} bytes encoded, over the limit of "
                f"{self.settings.max_payload_bytes} bytes (QueueSettings.max_payload_bytes)"
            )
        return text

    def calls(self, specs: Sequence[tuple[str, list[Any], int | None]]
              ) -> list[tuple[scripts.LuaScript, list[str], list[Any]]]:
        """The script calls that admit validated jobs (see :meth:`specs`)."""
        return self._calls(specs)

    def _calls(self, specs: Sequence[tuple[str, list[Any], int | None]]
               ) -> list[tuple[scripts.LuaScript, list[str], list[Any]]]:
        now = [s for s in specs if s[2] is None]
        later = [s for s in specs if s[2] is not None]
        calls: list[tuple[scripts.LuaScript, list[str], list[Any]]] = []
        for i in range(0, len(now), ADMIT_BATCH):
            chunk = now[i:i + ADMIT_BATCH]
            args: list[Any] = [self.keys.prefix, len(chunk)]
            for _, a, _ in chunk:
                args += a
            calls.append((scripts.ADMIT, scripts.admit_keys(self.keys), args))
        for i in range(0, len(later), ADMIT_BATCH):
            chunk = later[i:i + ADMIT_BATCH]
            args = [self.keys.prefix, len(chunk)]
            for _, a, due in chunk:
                args += [*a, due]
            calls.append((scripts.SCHEDULE, scripts.schedule_keys(self.keys), args))
        return calls

    # --- reading ------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        """The job with this id, or None when it does not exist (or was dropped by retention)."""
        validate_job_id(job_id)
        with translated(self.where):
            raw = self.redis.hgetall(self.keys.job(job_id))
        return Job.from_hash(self.name, raw) if raw else None

    def counts(self) -> dict[str, int]:
        """Jobs per state. ``completed`` and ``dead``: completed is a running total."""
        with translated(self.where):
            waiting, scheduled, active, completed, dead, *_ = scripts.counts(self.redis, self.keys)
        return dict(zip(STATES, (waiting, scheduled, active, completed, dead), strict=True))

    def stats(self) -> dict[str, int]:
        """Counts plus totals: retried, spilled (on the floor only) and lanes with work."""
        with translated(self.where):
            values = scripts.counts(self.redis, self.keys)
        names = (*STATES, "retried", "spilled", "lanes")
        return dict(zip(names, values, strict=True))

    def dead(self, limit: int = 100) -> list[Job]:
        """The oldest dead jobs, with their last error and traceback."""
        with translated(self.where):
            ids = self.redis.zrange(self.keys.dead, 0, limit - 1)
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self.keys.job(job_id.decode()))
            hashes = pipe.execute()
        return [Job.from_hash(self.name, h, strict=False) for h in hashes if h]

    def retry_dead(self, job_ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """Re-admit dead jobs (the given ids, or the oldest ``limit``); returns how many."""
        ids = [validate_job_id(j) for j in job_ids] if job_ids is not None else []
        if job_ids is not None and not ids:
            return 0
        with translated(self.where):
            return scripts.retry_dead(self.redis, self.keys, ids, limit)

    def ping(self) -> None:
        """Raise ConnectionFailed unless the server answers."""
        with translated(self.where):
            self.redis.ping()

    def close(self) -> None:
        self.redis.close()
