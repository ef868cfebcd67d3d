"""The Job record: what a handler receives and what ``Queue.get`` returns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from echomq.errors import CorruptJob

STATES = ("waiting", "scheduled", "active", "completed", "dead", "cancelled")
CLAIM_FIELDS = 12  # values per job returned by claim.lua


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _int(value: str | None, default: int = 0) -> int:
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        return default


@dataclass
class Job:
    """One job. ``attempts`` is 1 during the first execution; ``error`` is the last failure.

    ``timeout`` is the job's own time limit in seconds (None: the consumer's default).
    ``progress``: read from ``Queue.get``, the last value the handler reported; inside a
    handler, ``job.progress(value)`` reports one (JSON, small) and extends the lease.
    ``priority``: 0 to 9, higher first (read from ``Queue.get``; 0 inside a handler).
    ``due_ms``: a scheduled job's due time on the server clock, rounded up to the whole
    ms; a ``delay`` is kept to the microsecond, so the job is due up to 1 ms before it
    (and ``started_ms``, whole ms rounded down, may be 1 below it), never before the
    server's clock reached admit time + delay.
    ``spilled``: the job is due beyond the scheduler's spill horizon and held by the
    floor; Valkey keeps a stub, so ``payload`` and ``error`` are None unless read with a
    floor (``Queue(floor=...).get``).
    """

    id: str
    name: str
    payload: Any
    lane: str
    state: str
    attempts: int = 0
    max_attempts: int = 1
    error: str | None = None
    result: Any = None
    stalls: int = 0
    created_ms: int = 0
    due_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    queue: str = ""
    token: str | None = field(default=None, repr=False)
    backoff: str = field(default="", repr=False)
    trace: str = field(default="", repr=False)  # the producer's W3C traceparent, if any
    timeout: float | None = None
    progress: Any = None
    priority: int = 0
    spilled: bool = False

    def bind_progress(self, report: Any) -> None:
        """Inside a handler: ``job.progress(value)`` calls ``report(value)``."""
        self.progress = report

    @classmethod
    def from_hash(cls, queue: str, raw: dict[bytes, bytes] | dict[str, str], *,
                  strict: bool = True) -> Job:
        """Build a Job from its Redis hash; raise CorruptJob when required fields are missing
        (or, when ``strict``, when the payload is not JSON; otherwise the raw text is kept)."""
        h = {_text(k): _text(v) for k, v in raw.items()}
        missing = [f for f in ("id", "name", "lane", "state") if not h.get(f)]
        if missing:
            raise CorruptJob(f"job hash in queue {queue!r} lacks {', '.join(missing)}")
        job_id = h["id"] or ""
        try:
            payload = decode_payload(queue, job_id, h.get("payload") or "null")
        except CorruptJob:
            if strict:
                raise
            payload = h.get("payload")
        result_text = h.get("result")
        try:
            result = json.loads(result_text) if result_text else None
        except ValueError:
            result = result_text
        due = h.get("due_ms")
        started = h.get("started_ms")
        finished = h.get("finished_ms")
        progress_text = h.get("progress")
        try:
            progress = json.loads(progress_text) if progress_text else None
        except ValueError:
            progress = progress_text
        return cls(
            id=job_id,
            name=h["name"] or "",
            payload=payload,
            lane=h["lane"] or "",
            state=h["state"] or "",
            attempts=_int(h.get("attempts")),
            max_attempts=_int(h.get("max_attempts"), 1),
            error=h.get("error"),
            result=result,
            stalls=_int(h.get("stalls")),
            created_ms=_int(h.get("created_ms")),
            due_ms=_int(due) if due else None,
            started_ms=_int(started) if started else None,
            finished_ms=_int(finished) if finished else None,
            queue=queue,
            token=h.get("token") or None,
            backoff=h.get("backoff") or "",
            trace=h.get("trace") or "",
            timeout=timeout_seconds(h.get("timeout_ms")),
            progress=progress,
            priority=_int(h.get("priority")),
            spilled=h.get("spilled") == "1",
        )


@dataclass
class Claimed:
    """A leased job as claim.lua returns it; the payload is still undecoded text."""

    id: str
    token: str
    name: str
    payload_text: str
    lane: str
    attempts: int
    max_attempts: int
    backoff: str
    created_ms: int
    timeout: float | None = None
    trace: str = ""
    alone: bool = False  # a suspect of a process crash: run it with no other job beside it

    def to_job(self, queue: str) -> Job:
        """Decode the payload; raise CorruptJob when it is not JSON."""
        return Job(
            id=self.id, name=self.name,
            payload=decode_payload(queue, self.id, self.payload_text),
            lane=self.lane, state="active", attempts=self.attempts,
            max_attempts=self.max_attempts, created_ms=self.created_ms, queue=queue,
            token=self.token, backoff=self.backoff, timeout=self.timeout, trace=self.trace,
        )


def parse_claimed(flat: list[Any]) -> list[Claimed]:
    """Split claim.lua's flat reply into Claimed records (the hot path of every drain:
    every value is decoded in one pass, then the records are cut from it)."""
    values = [v.decode() if v.__class__ is bytes else str(v) for v in flat]
    out = []
    for i in range(0, len(values), CLAIM_FIELDS):
        (job_id, token, name, payload, lane, attempts, max_attempts, backoff, created,
         timeout_ms, trace, alone) = values[i:i + CLAIM_FIELDS]
        out.append(Claimed(
            job_id, token, name, payload, lane, _int(attempts),
            _int(max_attempts, 1), backoff, _int(created),
            timeout_seconds(timeout_ms) if timeout_ms else None, trace, alone != "",
        ))
    return out


def timeout_seconds(value: str | None) -> float | None:
    """The ``timeout_ms`` field as seconds; None when absent, empty or not positive."""
    ms = _int(value)
    return ms / 1000 if ms > 0 else None


def decode_payload(queue: str, job_id: str, text: str) -> Any:
    """Parse a stored payload; raises `CorruptJob` naming the job when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CorruptJob(f"job {job_id!r} in queue {queue!r} has a payload that is not JSON: {exc}"
                         ) from None
