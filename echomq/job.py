"""The Job record: what a handler receives and what ``Queue.get`` returns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from echomq.config import MAX_PAYLOAD_DEPTH
from echomq.errors import CorruptJob, PayloadError

STATES = ("waiting", "scheduled", "active", "completed", "dead", "cancelled", "blocked")
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
    # dependencies (docs/workflows.md): the ids this job waits for, and those waiting for it
    after: tuple[str, ...] = ()
    dependents: tuple[str, ...] = ()
    _results_of: Any = field(default=None, repr=False, compare=False)
    batch: list[Any] | None = field(default=None, repr=False)  # a debounced job's payloads
    load_batch: Any = field(default=None, repr=False, compare=False)

    def bind_dependencies(self, read: Any) -> None:
        """Inside a handler: ``job.dependency_results()`` calls ``read(job_id)``."""
        self._results_of = read

    def dependency_results(self) -> dict[str, Any]:
        """Inside a handler: ``{dependency id: result}`` of the jobs this one waited for
        (``after=``) that completed, in the order given (one read from the server)."""
        if self._results_of is None:
            raise RuntimeError("dependency_results() reads the server: call it inside a "
                               "handler (Queue.get(...).after lists the ids)")
        return dict(self._results_of(self.id))

    def bind_progress(self, report: Any) -> None:
        """Inside a handler: ``job.progress(value)`` calls ``report(value)``."""
        self.progress = report

    @property
    def payloads(self) -> list[Any]:
        """Every payload a debounced job gathered, in the order added (``payload`` is the
        last); ``[payload]`` for any other job. Inside a handler, read on first use."""
        if self.batch is None and self.load_batch is not None:
            self.batch = self.load_batch()
        return list(self.batch) if self.batch is not None else [self.payload]

    @classmethod
    def from_hash(cls, queue: str, raw: dict[bytes, bytes] | dict[str, str], *,
                  strict: bool = True) -> Job:
        """Build a Job from its Redis hash; raise CorruptJob when required fields are missing
        (or, when ``strict``, when the payload is not UTF-8 JSON a decoder can take; otherwise
        its text is kept, bytes that are not UTF-8 replaced)."""
        unreadable: list[str] = []  # fields that are not UTF-8 (another producer wrote them)
        h = {_text(k): _readable(v, unreadable, _text(k)) for k, v in raw.items()}
        missing = [f for f in ("id", "name", "lane", "state") if not h.get(f)]
        if missing:
            raise CorruptJob(f"job hash in queue {queue!r} lacks {', '.join(missing)}")
        job_id = h["id"] or ""
        try:
            if "payload" in unreadable:
                raise CorruptJob(not_utf8(queue, job_id))
            payload = decode_payload(queue, job_id, h.get("payload") or "null")
        except CorruptJob:
            if strict:
                raise
            payload = h.get("payload")
        result_text = h.get("result")
        try:
            result = json.loads(result_text) if result_text else None
        except (ValueError, RecursionError):  # not JSON, or too deep to decode: the text
            result = result_text
        due = h.get("due_ms")
        started = h.get("started_ms")
        finished = h.get("finished_ms")
        progress_text = h.get("progress")
        try:
            progress = json.loads(progress_text) if progress_text else None
        except (ValueError, RecursionError):
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
            after=tuple((h.get("after") or "").split()),
            dependents=tuple((h.get("dependents") or "").split()),
            batch=_batch(h.get("payloads")),
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
    unreadable: bool = False  # the payload is not UTF-8 (another producer wrote it)

    def to_job(self, queue: str) -> Job:
        """Decode the payload; raise CorruptJob when it is not UTF-8 or not JSON."""
        if self.unreadable:
            raise CorruptJob(not_utf8(queue, self.id))
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
    try:
        values = [v.decode() if v.__class__ is bytes else str(v) for v in flat]
    except UnicodeDecodeError:  # a field another producer wrote that is not UTF-8
        return _parse_unreadable(flat)
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


def _parse_unreadable(flat: list[Any]) -> list[Claimed]:
    """parse_claimed for a reply holding bytes that are not UTF-8: each such value is
    decoded with replacement characters, and a payload among them marks its job
    unreadable (its run fails it as corrupt); the rest of the batch runs as ever."""
    out = []
    for i in range(0, len(flat), CLAIM_FIELDS):
        unreadable: list[str] = []
        values = [_readable(v, unreadable, str(n)) for n, v in enumerate(flat[i:i + CLAIM_FIELDS])]
        [claimed] = parse_claimed(values)
        claimed.unreadable = "3" in unreadable  # the payload's place in a record
        out.append(claimed)
    return out


def _readable(value: Any, unreadable: list[str], name: str | None) -> str | None:
    """A reply's value as text; one that is not UTF-8 is decoded with replacement
    characters and its ``name`` added to ``unreadable``."""
    if value.__class__ is not bytes:
        return _text(value)
    try:
        return value.decode()
    except UnicodeDecodeError:
        unreadable.append(name or "")
        return value.decode(errors="replace")


def not_utf8(queue: str, job_id: str) -> str:
    """The error of a job whose payload is not UTF-8 text."""
    return f"job {job_id!r} in queue {queue!r} has a payload that is not UTF-8 text"


def timeout_seconds(value: str | None) -> float | None:
    """The ``timeout_ms`` field as seconds; None when absent, empty, not positive, or
    past what a float holds (no limit, as good as)."""
    ms = _int(value)
    try:
        return ms / 1000 if ms > 0 else None
    except OverflowError:
        return None


# what a depth check keeps of JSON text: the delimiters of strings, arrays and objects
# (no other byte, UTF-8 included, can be one), with objects' braces made brackets
_NOT_DELIMITER = bytes(b for b in range(256) if b not in b'"[]{}')
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_STEP = [0] * 256
_STEP[ord("[")], _STEP[ord("]")] = 1, -1
_PASSES = 8  # how many innermost levels are taken out a pass at a time (C) before counting


def payload_depth(data: bytes) -> int:
    """How deep arrays and objects nest in JSON text (UTF-8): 0 for a scalar, 1 for
    ``[1]``. Every step runs in C: strings are cut out (escaped backslashes and quotes
    first, then what lies between quotes), a few passes take out the innermost level
    each (most JSON is that shallow), and what is left is counted."""
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unescaped.translate(_BRACKETS, _NOT_DELIMITER).split(b'"')[::2])
    passes = 0
    while brackets and passes < _PASSES:
        brackets = brackets.replace(b"[]", b"")
        passes += 1
    return passes + max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


# json.dumps with these arguments, its encoder made once (dumps builds one per call)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_json(value: Any, what: str, max_bytes: int, max_depth: int, *,
                bytes_setting: str = "", depth_setting: str = "") -> str:
    """JSON text of ``value`` (``what`` names it in errors: "payload", "progress") of at
    most ``max_bytes`` of UTF-8, nested at most ``max_depth`` deep so that any consumer
    can decode it; PayloadError otherwise, naming the limit (and the setting holding it)."""
    try:
        text = _ENCODER.encode(value)
    except RecursionError:  # deeper than the encoder goes, so past any limit
        raise PayloadError(f"{what} is nested too deep to encode, over the limit of "
                           f"{max_depth} levels{_named(depth_setting)}") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from None
    try:
        data = text.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from a decoded file name
        raise PayloadError(f"{what} is not valid UTF-8 text: {exc.reason} at "
                           f"position {exc.start}") from None
    if len(data) > max_bytes:
        raise PayloadError(f"{what} is {len(data)} bytes encoded, over the limit of "
                           f"{max_bytes} bytes{_named(bytes_setting)}")
    # no more brackets than the limit, no deeper either: most payloads stop here
    if text.count("[") + text.count("{") > max_depth:
        depth = payload_depth(data)
        if depth > max_depth:
            raise PayloadError(f"{what} is nested {depth} levels deep, over the limit of "
                               f"{max_depth}{_named(depth_setting)}")
    return text


def _named(setting: str) -> str:
    return f" ({setting})" if setting else ""


def decode_payload(queue: str, job_id: str, text: str) -> Any:
    """Parse a stored payload; raises `CorruptJob` naming the job when it is not JSON or
    nests too deep for the decoder (a producer that skipped the admit checks wrote it).

    Text nested past what any admit lets through is refused before the decoder sees it,
    so decoding never runs near the interpreter's recursion limit (where a finalizer that
    runs meanwhile could fail in turn)."""
    if (len(text) > MAX_PAYLOAD_DEPTH  # shorter text holds fewer brackets than the limit
            and text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH
            and payload_depth(text.encode(errors="surrogatepass")) > MAX_PAYLOAD_DEPTH):
        raise CorruptJob(f"job {job_id!r} in queue {queue!r} has a payload nested too deep to "
                         f"decode (more than {MAX_PAYLOAD_DEPTH} levels)")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CorruptJob(f"job {job_id!r} in queue {queue!r} has a payload that is not JSON: {exc}"
                         ) from None


def _batch(text: str | None) -> list[Any] | None:
    """A debounced job's "payloads" field (a JSON array), None when absent or unreadable."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, list) else None
