"""What a job's admit sends, built without I/O: shared by :class:`echomq.Queue` and
:class:`echomq.aio.Queue`, which only send it.

:class:`AdmitPlanner` validates a job (name, lane, id, attempts, backoff, options),
encodes its payload within the queue's limits, works out its due time and builds
the admit and schedule script calls, chunked by count and bytes. It also keeps the
producer's reading of the queue's durability dial (when it was read, what it said)
and decides from it whether deferred jobs must reach the floor; the reading itself
is the caller's round trip.

A validated job is a spec: ``(job_id, admit args without the due, due arg or None)``.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from echomq import cron, scripts
from echomq.backoff import MAX_DELAY_S, Backoff
from echomq.config import QueueSettings
from echomq.errors import ConfigError, InvalidName, InvalidSchedule
from echomq.job import encode_json
from echomq.keys import DEFAULT_LANE, Keys, validate_job_id, validate_name
from echomq.tracing import current_traceparent

DIAL_TTL_S = 5.0  # how long a producer trusts the durability dial it read from the meta
ADMIT_BATCH = 500  # jobs per script call in add_many: bounds one script's run time
# Due times are stored as integer ms text; past 10**14 Lua would write them as floats
# ("1e+14"), so schedules end well before that: year 5000, or 100 years from now.
MAX_DUE_MS = 95_617_584_000_000  # 5000-01-01T00:00:00Z
JOB_OPTIONS = frozenset({"lane", "delay", "run_at", "job_id", "max_attempts", "backoff",
                         "timeout", "dedup_s", "priority", "expires"})

Spec = tuple[str, list[Any], "int | None"]
Call = tuple[scripts.LuaScript, list[str], list[Any]]


class AdmitPlanner:
    """The admits of one queue, as script calls; nothing here touches the network."""

    def __init__(self, name: str, settings: QueueSettings) -> None:
        self.name = name
        self.keys = Keys(name)
        self.settings = settings
        self._dial_read: tuple[float, str | None] | None = None  # (when, meta's dial)

    # --- jobs ---------------------------------------------------------------

    def spec(self, name: Any, payload: Any, lane: str | None, delay: float | None,
             run_at: datetime | None, job_id: str | None, max_attempts: int | None,
             backoff: Backoff | float | None, timeout: float | None = None,
             dedup_s: float | None = None, priority: int = 0) -> Spec:
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
        when = due(delay, run_at)
        args = [job_id, name, encoded, lane, attempts, self.settings.max_stalls,
                coerced.encode() if coerced else "", timeout_ms(timeout), dedup_ms(dedup_s),
                current_traceparent(), priority_arg(priority)]
        return job_id, args, when

    def specs(self, jobs: Iterable[Sequence[Any] | Mapping[str, Any]],
              expiries: dict[int, int] | None = None) -> list[Spec]:
        """Validate every job of an add_many call before anything is sent. A job's
        ``expires`` option goes into ``expiries`` (the job's index -> expire_mark
        argument); a caller that passes none takes no expiries (ValueError)."""
        from echomq.expiry import expires_arg

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
            unknown = set(opts) - JOB_OPTIONS
            if unknown:
                raise ValueError(f"unknown job option(s): {', '.join(sorted(unknown))}")
            until = opts.get("expires")
            if until is not None:
                if expiries is None:
                    raise ValueError("the expires option is taken by Queue.add_many and "
                                     "aio.Queue.add_many, not by this call")
                until = expires_arg(until)
            specs.append(self.spec(name, payload, opts.get("lane"), opts.get("delay"),
                                   opts.get("run_at"), opts.get("job_id"),
                                   opts.get("max_attempts"), opts.get("backoff"),
                                   opts.get("timeout"), opts.get("dedup_s"),
                                   opts.get("priority", 0)))
            if until is not None and expiries is not None:
                expiries[len(specs) - 1] = until
        return specs

    def encode_payload(self, payload: Any) -> str:
        """JSON-encode a payload within the size and depth limits; PayloadError otherwise."""
        return encode_json(payload, "payload", self.settings.max_payload_bytes,
                           self.settings.max_payload_depth,
                           bytes_setting="QueueSettings.max_payload_bytes",
                           depth_setting="QueueSettings.max_payload_depth")

    def cron_spec(self, key: str, expr: str, name: str, payload: Any, lane: str | None,
                  tz: str) -> cron.CronSpec:
        """Validate a cron as :meth:`echomq.Queue.add_cron` takes it."""
        return cron.make_spec(key, expr, name, self.encode_payload(payload), lane, tz,
                              self.settings.max_attempts, self.settings.max_stalls)

    def calls(self, specs: Sequence[Spec], guard_ms: int | None = None,
              tokens: Sequence[str] = (), leader: str = "") -> list[Call]:
        """The script calls that admit validated jobs: admit.lua for jobs due now,
        schedule.lua for deferred ones. The outbox relay passes its guard: ``guard_ms``,
        each spec's outbox token, in ``specs``' order, and the leader lease's value it
        runs under (lua/relayguard.lua)."""
        if guard_ms is None and len(specs) == 1 and specs[0][2] is None:
            # one job due now (a one-by-one add): one call, nothing to sort or chunk
            return [(scripts.ADMIT, scripts.admit_keys(self.keys),
                     [self.keys.prefix, 1, *specs[0][1]])]
        guarded = guard_ms is not None
        if guarded and len(tokens) != len(specs):
            raise ValueError("the relay's guard needs one outbox token per job")
        rows = list(zip(specs, tokens if guarded else [""] * len(specs), strict=True))
        now = [r for r in rows if r[0][2] is None]
        later = [r for r in rows if r[0][2] is not None]
        calls: list[Call] = []
        for chunk in self._chunks(now):
            args: list[Any] = [self.keys.prefix, len(chunk)]
            for (_, a, _), _ in chunk:
                args += a
            calls.append((scripts.ADMIT, scripts.admit_keys(self.keys),
                          args + _guard(guard_ms, chunk, leader)))
        for chunk in self._chunks(later):
            args = [self.keys.prefix, len(chunk)]
            for (_, a, when), _ in chunk:
                args += [*a, when]
            calls.append((scripts.SCHEDULE, scripts.schedule_keys(self.keys),
                          args + _guard(guard_ms, chunk, leader)))
        return calls

    def marked_calls(self, specs: Sequence[Spec], marks: Mapping[int, int]
                     ) -> list[list[Call]]:
        """The admit calls of jobs some of which expire (``marks``: a job's index in
        ``specs`` -> expire_mark argument), as transactions of at most ADMIT_BATCH jobs,
        each the admit of its jobs and their marks: no claim runs between a job's admit
        and its mark, and no transaction holds the server longer than one admit call and
        its marks. A mark names its job's payload: a job the admit left alone under the
        same id (an earlier one, or an earlier job of the same call) is not marked."""
        from echomq.expiry import mark_call

        out = []
        for start in range(0, len(specs), ADMIT_BATCH):
            group = specs[start:start + ADMIT_BATCH]
            out.append([*self.calls(group), *(
                mark_call(self.keys, job_id, marks[start + i], args[2])
                for i, (job_id, args, _) in enumerate(group) if start + i in marks)])
        return out

    def _chunks(self, rows: Sequence[tuple[Spec, str]]) -> list[Sequence[tuple[Spec, str]]]:
        """Script calls of at most ADMIT_BATCH jobs and ``admit_call_bytes`` of payload
        (one job over the bound still goes, alone); ``rows``: (spec, outbox token)."""
        chunks: list[Sequence[tuple[Spec, str]]] = []
        start = size = 0
        for i, (spec, _) in enumerate(rows):
            n = len(spec[1][2].encode())  # the encoded payload; validated as UTF-8 already
            if i > start and (i - start >= ADMIT_BATCH
                              or size + n > self.settings.admit_call_bytes):
                chunks.append(rows[start:i])
                start, size = i, 0
            size += n
        if start < len(rows):
            chunks.append(rows[start:])
        return chunks

    # --- the durability dial --------------------------------------------------

    def dial_stale(self) -> bool:
        """True when the recorded dial must be read again from the queue's meta (never
        read, or read over DIAL_TTL_S ago); :meth:`note_dial` records what was read."""
        return self._dial_read is None or time.monotonic() - self._dial_read[0] > DIAL_TTL_S

    def note_dial(self, recorded: bytes | str | None) -> None:
        """Remember the meta's ``durability`` field as just read (None: not recorded)."""
        text = recorded.decode() if isinstance(recorded, bytes) else recorded
        self._dial_read = (time.monotonic(), text or None)

    def dial(self) -> str | None:
        """The dial as last read, else this producer's own setting (None when neither
        says)."""
        recorded = self._dial_read[1] if self._dial_read is not None else None
        return recorded or self.settings.durability

    def floor_sync(self, dial: str | None, has_floor: bool) -> bool:
        """Whether deferred jobs must reach the floor before the admit returns, for a queue
        whose dial reads ``dial`` (this producer's own setting counts too).

        Raises:
            ConfigError: the dial says "sync" and this producer has no floor (the caller
                has admitted nothing yet).
        """
        sync = "sync" in (dial, self.settings.durability)
        if sync and not has_floor:
            raise ConfigError(
                f"queue {self.name!r} has durability 'sync': deferred jobs must reach the floor "
                "before add() returns, and this producer has no floor. Pass "
                "floor=echomq.floor.Floor.from_url(FLOOR_URL) to Queue (nothing was admitted)")
        return sync


def has_deferred(specs: Sequence[Spec]) -> bool:
    """True when any of these validated jobs is deferred (has a due time)."""
    return any(s[2] is not None for s in specs)


def deferred_ids(specs: Sequence[Spec]) -> list[str]:
    """The ids of the deferred jobs among these validated ones (those the floor takes)."""
    return [s[0] for s in specs if s[2] is not None]


def added(specs: Sequence[Spec]) -> Iterator[tuple[str, str, Any]]:
    """(job id, name, payload decoded again) of validated jobs, for before_add hooks."""
    for job_id, args, _ in specs:
        yield job_id, args[1], json.loads(args[2])


def due(delay: float | None, run_at: datetime | None) -> int | None:
    """The schedule script's due argument: -delay_ms, absolute ms, or None for now."""
    if delay is not None and run_at is not None:
        raise InvalidSchedule("give delay or run_at, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidSchedule(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidSchedule("run_at must be timezone-aware, not naive")
        at = max(0, int(run_at.timestamp() * 1000))
        if at > MAX_DUE_MS:
            raise InvalidSchedule(f"run_at {run_at.isoformat()} is too far in the future "
                                  "(the limit is the year 5000)")
        return at
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or math.isnan(delay):
        raise InvalidSchedule(f"delay must be a number of seconds, got {delay!r}")
    if delay < 0 or math.isinf(delay):
        raise InvalidSchedule(f"delay must be a finite number of seconds >= 0, got {delay!r}")
    if delay > MAX_DELAY_S:
        raise InvalidSchedule(f"delay {delay!r} s is too far in the future "
                              f"(at most {MAX_DELAY_S:.0f} s, 100 years)")
    ms = int(delay * 1000)
    return None if ms == 0 else -ms


def priority_arg(priority: Any) -> str:
    """A job's priority as the scripts take it: "0" to "9"."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise ValueError(f"priority must be an integer from 0 to 9, got {priority!r}")
    return str(priority)


def timeout_ms(timeout: float | None) -> str:
    """A job's time limit as the scripts store it: whole ms, '' for none."""
    if timeout is None:
        return ""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    return str(max(1, math.ceil(timeout * 1000)))


def dedup_ms(dedup_s: float | None) -> str:
    """How long a completed job's id stays reserved, in whole ms; '' for none (or 0)."""
    if dedup_s is None:
        return ""
    if isinstance(dedup_s, bool) or not isinstance(dedup_s, (int, float)) or not (
            math.isfinite(dedup_s) and 0 <= dedup_s <= MAX_DELAY_S):
        raise ValueError(f"dedup_s must be a number of seconds from 0 to 100 years, "
                         f"got {dedup_s!r}")
    ms = math.ceil(dedup_s * 1000)
    return str(ms) if ms > 0 else ""


def refuse_mixed(tx: bool = False, after: bool = False, expires: bool = False,
                 debounce: bool = False) -> None:
    """Options of one add that do not combine: a clear ValueError, nothing admitted.

    The outbox (``tx=``) relays plain jobs; a job with dependencies (``after=``) takes
    neither an expiry nor a debounce key; a debounced job may expire.
    """
    given = [n for n, on in (("tx=", tx), ("after=", after), ("expires=", expires),
                             ("debounce=", debounce)) if on]
    if len(given) > 1 and set(given) != {"expires=", "debounce="}:
        raise ValueError(f"{' and '.join(given)} cannot be combined in one add "
                         "(nothing was admitted); see docs/reference.md")


def _guard(guard_ms: int | None, chunk: Sequence[tuple[Spec, str]], leader: str
           ) -> list[Any]:
    """The relay's guard after a chunk's jobs: its ms, each job's outbox token, then the
    leader lease's value the relay runs under."""
    return [] if guard_ms is None else [guard_ms, *(token for _, token in chunk), leader]
