"""The "durable" dial on the producer side: every admitted job is on the floor before
``add``/``add_many`` returns.

After the admit, one script call per chunk marks the admitted jobs as held by the floor
(field "deferred", so settle, cancel and reap hand them to the scheduler's closed log
and their rows close within a beat) and reads their hashes; one floor transaction then
writes their rows, each with its admit order (``seq``) so a rehydration puts waiting
jobs back on their lanes in the order they were added.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis

from echomq import scripts
from echomq.errors import ConfigError, FloorError
from echomq.keys import Keys

log = logging.getLogger("echomq.durable")

if TYPE_CHECKING:  # SQLAlchemy (the floor extra) is imported only where a floor is used
    from echomq.admit import Spec
    from echomq.floor.store import Floor, FloorRow

DURABLE = "durable"
MARK = scripts.DURABLE_MARK
REQUEUE = scripts.REQUEUE
MARK_BATCH = 1000  # ids per durable_mark call: one call stays short


def as_floor(floor: Any) -> Floor | None:
    """``Queue(floor=...)``: a :class:`~echomq.floor.Floor`, a floor URL, or None."""
    if isinstance(floor, str):
        from echomq.floor.store import Floor

        return Floor.from_url(floor)
    return floor


def is_durable(dial: str | None, own: str | None) -> bool:
    """True when the queue's dial (or this producer's own setting) says "durable"."""
    return DURABLE in (dial, own)


def require_floor(queue: str, floor: Floor | None) -> None:
    """A producer of a "durable" queue must have a floor; refuse before admitting."""
    if floor is None:
        raise ConfigError(
            f"queue {queue!r} has durability 'durable': every job must reach the floor "
            "before add() returns, and this producer has no floor. Pass floor=FLOOR_URL "
            "(or an echomq.floor.Floor) to Queue (nothing was admitted)")


def mark_calls(keys: Keys, job_ids: Sequence[str]) -> list[list[Any]]:
    """The durable_mark calls' arguments for these ids, chunked."""
    return [[keys.prefix, *job_ids[i:i + MARK_BATCH]]
            for i in range(0, len(job_ids), MARK_BATCH)]


# a job's dependencies and on_dep_failure (echomq.depend), None for a job without
Deps = tuple[list[str], str] | None


def spec_fields(spec: Spec, now_ms: int, deps: Deps = None) -> dict[str, str]:
    """A job's hash as its admit (admit.lua / schedule.lua / block.lua) writes it, from its
    spec (and its dependencies: a blocked job, its fan-in rebuilt by a rehydration)."""
    job_id, a, due = spec
    h = {"id": job_id, "name": a[1], "payload": a[2], "lane": a[3], "attempts": "0",
         "max_attempts": str(a[4]), "stalls": "0", "max_stalls": str(a[5]),
         "backoff": a[6], "created_ms": str(now_ms), "state": "waiting"}
    for field, value in (("timeout_ms", a[7]), ("dedup_ms", a[8]), ("trace", a[9])):
        if value != "":
            h[field] = str(value)
    if a[10] != "0":
        h["priority"] = a[10]
    if due is not None:
        h.update(state="scheduled", deferred="1",
                 due_ms=str(now_ms - due if due < 0 else due))
    elif deps is not None:
        h.update(state="blocked", deferred="1", dep_fail=deps[1])
        if deps[0]:
            h["after"] = " ".join(deps[0])
    return h


def rows_of(specs: Sequence[Spec], replies: Sequence[Any], seq0: int,
            deps: Sequence[Deps] | None = None) -> list[FloorRow]:
    """Floor rows of the marked jobs (a reply per job: its flat hash; empty: finished, no
    row; 0: gone since the admit, the row is built from the spec and ``deps``)."""
    from echomq.floor.store import FloorRow

    rows = []
    now_ms = time.time_ns() // 1_000_000
    for i, (spec, flat) in enumerate(zip(specs, replies, strict=True)):
        job_id = spec[0]
        if flat == 0:
            h = spec_fields(spec, now_ms, deps[i] if deps else None)
        elif not flat:
            continue
        else:
            h = {_text(k): _text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
        due = h.get("due_ms") if h.get("state") == "scheduled" else h.get("created_ms")
        rows.append(FloorRow(job_id=job_id, due_ms=int(due or 0), fields=h, seq=seq0 + i))
    return rows


def write_admitted(client: redis.Redis, keys: Keys, floor: Floor,
                   specs: Sequence[Spec], deps: Sequence[Deps] | None = None,
                   conn: Any = None) -> int:
    """Mark these just-admitted jobs and write their rows in one floor commit (or in the
    transaction ``conn`` on the floor's database); returns the rows written (``deps``:
    each job's dependencies, for add_blocked). Raises FloorError when the floor refuses:
    the jobs are admitted all the same (they run), and their ids go onto the fold log, so
    the scheduler writes their rows within a beat of the floor taking writes again."""
    if not specs:
        return 0
    seq0 = time.time_ns()
    replies: list[Any] = []
    for args in mark_calls(keys, [s[0] for s in specs]):
        replies += MARK(client, [keys.meta], args)
    rows = rows_of(specs, replies, seq0, deps)
    try:
        floor.write_through(keys.queue, rows, conn)
    except FloorError:
        if rows:
            client.rpush(keys.fold, *[r.job_id for r in rows])
        raise
    return len(rows)


def write_before_admit(floor: Floor, keys: Keys, specs: Sequence[Spec],
                       conn: Any = None) -> int:
    """The rows of jobs about to be admitted, from their specs, in one floor commit (or in
    ``conn``'s transaction): the outbox relay under the "durable" dial writes them first,
    so a floor that refuses fails the batch before anything is admitted. Returns the
    rows written (FloorError when the floor refuses)."""
    rows = rows_of(specs, [0] * len(specs), time.time_ns())
    floor.write_through(keys.queue, rows, conn)
    return len(rows)


def mark(client: redis.Redis, keys: Keys, job_ids: Sequence[str]) -> None:
    """durable_mark these just-admitted jobs (their floor rows close when they finish)."""
    for args in mark_calls(keys, job_ids):
        MARK(client, [keys.meta], args)


async def write_admitted_async(client: Any, keys: Keys, floor: Floor,
                               specs: Sequence[Spec], deps: Sequence[Deps] | None = None
                               ) -> int:
    """:func:`write_admitted` for an asyncio client; the floor's commit runs in a thread."""
    import asyncio

    if not specs:
        return 0
    seq0 = time.time_ns()
    replies: list[Any] = []
    for args in mark_calls(keys, [s[0] for s in specs]):
        try:
            replies += await client.evalsha(MARK.sha, 1, keys.meta, *args)
        except redis.exceptions.NoScriptError:
            await client.script_load(MARK.source)
            replies += await client.evalsha(MARK.sha, 1, keys.meta, *args)
    rows = rows_of(specs, replies, seq0, deps)
    try:
        await asyncio.to_thread(floor.write_through, keys.queue, rows)
    except FloorError:  # as write_admitted: the scheduler's fold writes them
        if rows:
            await client.rpush(keys.fold, *[r.job_id for r in rows])
        raise
    return len(rows)


# (queue, id) this process wrote with tx= (the latest ones): their rows' tokens
OUTBOXED: dict[tuple[str, str], str] = {}
OUTBOXED_KEEP = 10_000
RELAY_WAIT_SLICE_S = 5.0  # longest single BLMOVE of a result() waiting for the relay
RELAYED_TTL_MS = 60_000  # how long a relayed row's doorbell is kept after its delete
RELAY_HELD_MS = 24 * 3600 * 1000  # ... from its admit until then (the relay's guard)
LIVE_STATES = ("waiting", "scheduled", "active", "blocked")  # a job not finished


def to_outbox(tx: Any, queue: str, specs: Sequence[Spec]) -> None:
    """``tx=``: these jobs into the outbox on the caller's transaction
    (:func:`echomq.outbox.write`; SQLAlchemy is imported only here)."""
    from echomq import outbox

    outbox.write(tx, queue, specs)


async def to_outbox_async(tx: Any, queue: str, specs: Sequence[Spec]) -> None:
    """:func:`to_outbox` on an AsyncConnection or AsyncSession."""
    from echomq import outbox

    await outbox.write_async(tx, queue, specs)


def note_outboxed(queue: str, tokens: Mapping[str, str]) -> None:
    """Remember the ids written into ``queue``'s outbox and their rows' tokens
    (:func:`echomq.outbox.rows`), so result() waits for the relay's admit of that row."""
    OUTBOXED.update(((queue, job_id), token) for job_id, token in tokens.items())
    while len(OUTBOXED) > OUTBOXED_KEEP:
        del OUTBOXED[next(iter(OUTBOXED))]


def relayed_key(keys: Keys, job_id: str, token: str) -> str:
    """The doorbell of an outbox row the relay's admit rings (lua/relayguard.lua): a
    result() waiting across the relay wakes on it, and the relay's guard reads it."""
    return f"{keys.prefix}relayed:{job_id}:{token}"


def trim_relayed(client: redis.Redis, keys: Keys, rows: Sequence[tuple[str, str]]) -> None:
    """The relayed rows' delete committed: their doorbells (``rows``: job id, token) are
    kept RELAYED_TTL_MS from now, for result() waiters, not the guard's RELAY_HELD_MS.
    Best effort: a server that refuses this leaves them a day."""
    pipe = client.pipeline(transaction=False)
    for job_id, token in rows:
        pipe.pexpire(relayed_key(keys, job_id, token), RELAYED_TTL_MS)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("%d relayed job(s) keep their doorbells a day: %s", len(rows), exc)


def relayed_rows(client: redis.Redis, keys: Keys, rows: Sequence[tuple[str, str]],
                 rolled_back: bool = False) -> list[bool]:
    """For each outbox row (job id, token): True when its floor row is not to be written
    again: a relay admitted it before (its doorbell exists), after that row's floor write
    committed. ``rolled_back``: the floor shares the outbox's transaction (a SQLite file
    of both), so a failed batch's floor rows went with it, and only a job finished or
    gone since needs none (a waiting, scheduled, active or blocked one does)."""
    pipe = client.pipeline(transaction=False)
    for job_id, token in rows:
        pipe.exists(relayed_key(keys, job_id, token))
        pipe.hget(keys.job(job_id), "state")
    replies = pipe.execute()
    out = []
    for i in range(0, len(replies), 2):
        state = replies[i + 1].decode() if isinstance(replies[i + 1], bytes) else replies[i + 1]
        out.append(bool(replies[i]) and not (rolled_back and state in LIVE_STATES))
    return out


def await_relay(client: redis.Redis, keys: Keys, queue: str, job_id: str,
                timeout: float | None) -> float | None:
    """Block until the relay admitted this outbox job (at once if it has, or if this
    process wrote no row of it); returns the timeout left. TimeoutError when it passes
    first (a rollback never rings). Between slices of the wait the job itself is looked
    for: the row waited on may be a later add of the id that rolled back, while the
    relay admitted an earlier one."""
    start = time.monotonic()
    token = OUTBOXED.get((queue, job_id))  # another thread's result() may have taken it
    if token is None or client.exists(keys.job(job_id), keys.dedup(job_id)):
        OUTBOXED.pop((queue, job_id), None)
        return timeout
    # BLMOVE onto itself: the ring stays for other waiters (and in a producer's ACL); in
    # slices shorter than the client's socket timeout, which would cut a longer block
    key = relayed_key(keys, job_id, token)
    pool = getattr(client, "connection_pool", None)  # a cluster client keeps its own
    kwargs = getattr(pool, "connection_kwargs", {})
    # redis-py 8 keeps its default (5 s) as "orig_socket_timeout" when none was given
    socket_s = kwargs.get("socket_timeout") or kwargs.get("orig_socket_timeout")
    slice_s = RELAY_WAIT_SLICE_S if not socket_s else min(RELAY_WAIT_SLICE_S, socket_s / 2)
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - start)
        if left is not None and left <= 0:
            raise TimeoutError(f"job {job_id!r} was not relayed from the outbox within "
                               f"{timeout} s (was its transaction committed?)")
        # never below 10 ms: a BLMOVE timeout that rounds to 0 would block for good
        block_s = slice_s if left is None else max(0.01, min(slice_s, left))
        if client.blmove(key, key, block_s, "LEFT", "RIGHT") is not None:
            break
        if client.exists(keys.job(job_id), keys.dedup(job_id)):
            break
    OUTBOXED.pop((queue, job_id), None)
    return None if timeout is None else max(0.001, timeout - (time.monotonic() - start))


def requeue_args(keys: Keys, rows: Sequence[FloorRow]) -> list[Any]:
    """requeue.lua's arguments for these rows (in order), their lease fields dropped."""
    args: list[Any] = [keys.prefix]
    for row in rows:
        fields = {k: v for k, v in row.fields.items() if k not in ("token", "held")}
        args += [row.job_id, len(fields)]
        for k, v in fields.items():
            args += [k, v]
    return args


def requeue_keys(keys: Keys) -> list[str]:
    """KEYS of requeue.lua, in its header's order."""
    return [keys.ring, keys.wake, keys.stats, keys.prios, keys.spilled, keys.events]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
