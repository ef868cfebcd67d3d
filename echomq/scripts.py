"""The Lua scripts, loaded once and called by SHA, one typed wrapper per script.

redis-py's ``register_script`` would do load-once and NOSCRIPT reload for
single calls, but inside a pipeline it sends ``SCRIPT EXISTS`` on every
execute; settle-and-claim is pipelined on the hot path, so scripts here are
loaded explicitly and re-loaded only when the server answers NOSCRIPT.

On a cluster, EVALSHA goes to the node owning its first key's slot (redis-py's
RedisCluster routes it like any keyed command, following MOVED and ASK), while
a bare SCRIPT LOAD goes to every primary. A replica promoted by a failover, or
the node a slot moved to, may not have the script: its NOSCRIPT is answered by
loading the script on the node owning that slot and calling again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from enum import IntEnum
from importlib import resources
from typing import Any

import redis
import redis.exceptions

from echomq.connection import is_cluster, learn_redirect, node_client, on_node
from echomq.keys import Keys
from echomq.packing import pack_calls, pack_commands

Arg = str | int | float | bytes


class Settled(IntEnum):
    """Per-job codes returned by ``settle.lua``."""

    STALE = 0
    COMPLETED = 1
    RETRYING = 2
    DEAD = 3


SETTLED = tuple(Settled)  # by code: a tuple lookup per job, not an enum call


def settled_codes(reply: Sequence[Any]) -> list[Settled]:
    """settle.lua's reply as codes, one per job."""
    return [SETTLED[int(c)] for c in reply]


class Cancelled(IntEnum):
    """Codes returned by ``cancel.lua``."""

    NOT_FOUND = 0
    CANCELLED = 1
    ACTIVE = 2
    FINISHED = 3


def expand(source: str) -> str:
    """A script's text with each line ``--!include NAME`` replaced by ``lua/NAME.lua``
    (a library of local functions, e.g. the dependency fan-in of deps.lua)."""
    lines = source.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("--!include "):
            lib = line.split()[1]
            lines[i] = resources.files("echomq").joinpath("lua", f"{lib}.lua").read_text()
    return "\n".join(lines)


class LuaScript:
    """One script file: its source, SHA1 and the number of KEYS its header declares."""

    def __init__(self, name: str, num_keys: int) -> None:
        self.name = name
        self.num_keys = num_keys
        self.source = expand(resources.files("echomq").joinpath("lua", f"{name}.lua").read_text())
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        if len(keys) != self.num_keys:
            raise ValueError(f"{self.name}.lua takes {self.num_keys} keys, got {len(keys)}")
        try:
            if type(client) is redis.Redis and client.connection is None:
                return _direct(client, self.sha, self.num_keys, keys, args)
            return client.evalsha(self.sha, self.num_keys, *keys, *args)
        except redis.exceptions.NoScriptError:
            self.load(client, keys[0] if keys else None)
            return client.evalsha(self.sha, self.num_keys, *keys, *args)

    def load(self, client: redis.Redis, key: str | None = None) -> None:
        """SCRIPT LOAD on the node owning ``key``'s slot (every primary when no key)."""
        if key is None:
            client.script_load(self.source)
        else:
            on_node(client, key, lambda node: node.script_load(self.source))

    def queue(self, pipe: redis.client.Pipeline, keys: Sequence[str], args: Sequence[Arg]) -> None:
        """Add a call to a pipeline; see :func:`execute` for the NOSCRIPT handling."""
        pipe.evalsha(self.sha, self.num_keys, *keys, *args)


def _direct(client: redis.Redis, sha: str, num_keys: int, keys: Sequence[str],
            args: Sequence[Arg]) -> Any:
    """One EVALSHA written and read on a pooled connection, without redis-py's
    per-command wrapping (its retry closure, timing records and callbacks: EVALSHA has
    no reply callback), about a sixth of a single script call's client instructions. A
    client whose calls redis-py retries takes redis-py's own path; otherwise a connection
    or timeout error closes the connection and is raised, as redis-py raises it (the call
    is never sent twice: a claim whose reply was lost must not claim again)."""
    pool = client.connection_pool
    conn = pool.get_connection()
    if conn.retry.get_retries():
        pool.release(conn)
        return client.evalsha(sha, num_keys, *keys, *args)
    try:
        conn.send_packed_command(
            pack_commands(conn, [("EVALSHA", sha, num_keys, *keys, *args)]))
        return conn.read_response()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


ADMIT = LuaScript("admit", 7)
SCHEDULE = LuaScript("schedule", 6)
CLAIM = LuaScript("claim", 13)
SETTLE = LuaScript("settle", 15)
EXTEND = LuaScript("extend", 1)
REAP = LuaScript("reap", 13)
PROMOTE = LuaScript("promote", 8)
COUNTS = LuaScript("counts", 10)
RETRY_DEAD = LuaScript("retry_dead", 6)
LEAD = LuaScript("lead", 6)
SPILL = LuaScript("spill", 2)
RESTORE = LuaScript("restore", 3)
BURY = LuaScript("bury", 5)
TRIM_DEAD = LuaScript("trim_dead", 2)
AWAIT = LuaScript("await", 2)
PROGRESS = LuaScript("progress", 2)
PAUSE = LuaScript("pause", 1)
RESUME = LuaScript("resume", 4)
CANCEL = LuaScript("cancel", 9)
JOBS = LuaScript("jobs", 5)
PURGE = LuaScript("purge", 1)
SURVEY = LuaScript("survey", 1)
LIMIT = LuaScript("limit", 6)
BACKFILL = LuaScript("backfill", 1)
CRON_SET = LuaScript("cron_set", 3)
CRON_REMOVE = LuaScript("cron_remove", 3)
CRON_FIRE = LuaScript("cron_fire", 8)
CRON_RESTORE = LuaScript("cron_restore", 3)
LIMITS_RESTORE = LuaScript("limits_restore", 3)
LIMITS_READ = LuaScript("limits_read", 3)
BLOCK = LuaScript("block", 2)  # admit of jobs with dependencies (echomq/workflow scripts)
REBLOCK = LuaScript("reblock", 1)  # blocked jobs back from the floor (rehydration)
# control of running work (echomq.stopping, echomq.expiry, echomq.debouncing)
STOP = LuaScript("stop", 11)
EXPIRE_MARK = LuaScript("expire_mark", 1)
EXPIRE = LuaScript("expire", 10)
DEBOUNCE = LuaScript("debounce", 5)
# the "durable" dial (echomq.durable): floor rows of admitted jobs, rehydration
DURABLE_MARK = LuaScript("durable_mark", 1)
REQUEUE = LuaScript("requeue", 6)
RETIRE = LuaScript("retire", 2)  # a dead consumer's claimer name (echomq.supervisor.release)
CLOSED_READ = LuaScript("closed_read", 2)  # the scheduler's closed log (supervisor/fold.py)
ALL = (ADMIT, SCHEDULE, CLAIM, SETTLE, EXTEND, REAP, PROMOTE, COUNTS, RETRY_DEAD, LEAD, SPILL,
       RESTORE, BURY, TRIM_DEAD, AWAIT, PROGRESS, PAUSE, RESUME, CANCEL, JOBS, PURGE, SURVEY, LIMIT,
       BACKFILL, CRON_SET, CRON_REMOVE, CRON_FIRE, CRON_RESTORE, LIMITS_RESTORE, LIMITS_READ, BLOCK,
       REBLOCK, STOP, EXPIRE_MARK, EXPIRE, DEBOUNCE, DURABLE_MARK, REQUEUE, RETIRE, CLOSED_READ)


# lua files included by others ("--!include NAME"), not run alone
LIBRARIES = ("deps", "events", "records", "relayguard")


def load_all(client: redis.Redis, key: str | None = None) -> None:
    """SCRIPT LOAD every script the server lacks (once per connection target, before
    pipelining): one SCRIPT EXISTS when they are all there, as after a sibling's load.
    On a cluster: on the node owning ``key``'s slot, or on every primary when no key."""

    def load(node: redis.Redis) -> None:
        present = node.script_exists(*(script.sha for script in ALL))
        for script, loaded in zip(ALL, present, strict=True):
            if not loaded:
                node.script_load(script.source)

    if key is None:
        load(client)
    else:
        on_node(client, key, load)


def execute(client: redis.Redis, calls: Sequence[tuple[LuaScript, Sequence[str], Sequence[Arg]]]
            ) -> list[Any]:
    """Run script calls in one pipeline (one round trip), reloading on NOSCRIPT.

    A call refused with NOSCRIPT did not run, so it is re-run alone after loading.
    On a cluster the calls go in one plain pipeline per node (redis-py's cluster
    pipeline would ask the server for the keys of every EVALSHA first: a round trip
    each); a call refused with MOVED, ASK, TRYAGAIN or CLUSTERDOWN did not run either,
    and is re-run alone through the cluster client, which follows the redirect.
    """
    if not is_cluster(client):
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            script.queue(pipe, keys, args)
        return _settle(client, calls, pipe.execute(raise_on_error=False))
    groups: dict[int, tuple[redis.Redis, list[int]]] = {}
    for i, (_, keys, _) in enumerate(calls):
        node = node_client(client, keys[0])
        groups.setdefault(id(node), (node, []))[1].append(i)
    results: list[Any] = [None] * len(calls)
    for node, indexes in groups.values():

        def send(node: redis.Redis, indexes: list[int] = indexes) -> list[Any]:
            pipe = node.pipeline(transaction=False)
            for i in indexes:
                script, keys, args = calls[i]
                script.queue(pipe, keys, args)
            return list(pipe.execute(raise_on_error=False))

        for i, result in zip(indexes, on_node(client, calls[indexes[0]][1][0], send),
                             strict=True):
            results[i] = result
    return _settle(client, calls, results)


def execute_atomically(client: redis.Redis,
                       calls: Sequence[tuple[LuaScript, Sequence[str], Sequence[Arg]]]
                       ) -> list[Any]:
    """Run script calls of one queue in one MULTI/EXEC (its node's, on a cluster): no other
    client's command runs between them. A script the server lacks fails its calls at
    EXEC while the others run, so calls of more than one script are preceded, inside the
    transaction, by a SCRIPT LOAD of each (a partial run could not be undone); calls of
    one script fail all together, and then the script is loaded and the transaction runs
    again. A call's error is raised."""
    target = node_client(client, calls[0][1][0]) if is_cluster(client) else client
    distinct = list({script.sha: script for script, _, _ in calls}.values())
    preload = distinct if len(distinct) > 1 else []
    for attempt in range(2):
        pipe = target.pipeline(transaction=True)
        for script in preload:
            pipe.script_load(script.source)
        for script, keys, args in calls:
            script.queue(pipe, keys, args)
        results = pipe.execute(raise_on_error=False)[len(preload):]
        missing = [c for c, r in zip(calls, results, strict=True)
                   if isinstance(r, redis.exceptions.NoScriptError)]
        if not missing or attempt:
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return list(results)
        for script, keys, _ in missing:
            script.load(client, keys[0])
    raise AssertionError("unreachable")


class InFlight:
    """Script calls written to a connection whose replies are not read yet (see :func:`send`)."""

    def __init__(self, client: redis.Redis, conn: Any,
                 calls: Sequence[tuple[LuaScript, Sequence[str], Sequence[Arg]]]) -> None:
        self.client = client
        self.conn = conn
        self.calls = calls
        self.passed_on = False  # a request written behind this one owns the connection next

    def then(self, calls: Sequence[tuple[LuaScript, Sequence[str], Sequence[Arg]]]) -> InFlight:
        """Write more calls behind these, on the same connection, before their replies are
        read: the server runs them in order. Read this one first; the connection goes
        back to the pool with the reply of the last. A write that fails drops the
        connection, and this one's read then fails too."""
        try:
            # no health check: its PING would read the reply still unread as its own
            self.conn.send_packed_command(pack_calls(self.conn, calls), check_health=False)
        except BaseException:
            self.conn.disconnect()
            raise
        self.passed_on = True
        return InFlight(self.client, self.conn, calls)

    def read(self) -> list[Any]:
        """Read every reply (each call's result, in order), hand the connection back (unless
        a request written behind owns it now) and re-run alone each call that did not
        run, as :func:`execute` does. A network error drops the connection: whether the
        calls ran, and any written behind them, is then unknown."""
        conn, pool = self.conn, self.client.connection_pool
        results: list[Any] = []
        try:
            for _ in self.calls:
                try:
                    results.append(conn.read_response())
                except redis.exceptions.ResponseError as exc:  # read whole: the next is intact
                    results.append(exc)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            if not self.passed_on:  # else the request behind hands it back (read or drop)
                pool.release(conn)
        return _settle(self.client, self.calls, results)

    def drop(self) -> None:
        """Give up on these replies (a request before them failed): drop the connection,
        so none is read by mistake later, and hand it back; whether the calls ran is
        unknown."""
        self.conn.disconnect()
        self.client.connection_pool.release(self.conn)


def send(client: redis.Redis, calls: Sequence[tuple[LuaScript, Sequence[str], Sequence[Arg]]]
         ) -> InFlight:
    """Write script calls in one request without waiting for their replies; the caller
    reads them later with :meth:`InFlight.read` (meanwhile the connection is its own).
    For a plain server only: a cluster client goes through :func:`execute`."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(pack_calls(conn, calls))
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    return InFlight(client, conn, calls)


NOT_RUN = (redis.exceptions.NoScriptError, redis.exceptions.AskError,
              redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)


def _settle(client: redis.Redis, calls: Sequence[tuple[LuaScript, Sequence[str], Sequence[Arg]]],
            results: list[Any]) -> list[Any]:
    """Re-run alone each call that did not run (NOSCRIPT, a redirect); raise other errors."""
    for i, result in enumerate(results):
        if isinstance(result, NOT_RUN):
            learn_redirect(client, result)
            script, keys, args = calls[i]
            results[i] = script(client, keys, args)
        elif isinstance(result, Exception):
            raise result
    return list(results)


# --- typed wrappers: keys are chosen here, once ---------------------------------

def admit_keys(k: Keys) -> list[str]:
    """KEYS of admit.lua, in its header's order."""
    return [k.ring, k.wake, k.spilled, k.stats, k.paused, k.prios, k.events]


def schedule_keys(k: Keys) -> list[str]:
    """KEYS of schedule.lua, in its header's order."""
    return [k.schedule, k.wake, k.meta, k.fold, k.spilled, k.events]


def claim_keys(k: Keys) -> list[str]:
    """KEYS of claim.lua, in its header's order."""
    return [k.ring, k.leases, k.tokens, k.wake, k.stats, k.paused, k.limits, k.prios, k.active,
            k.blocked, k.lanewake, k.schedule, k.events]


def settle_keys(k: Keys) -> list[str]:
    """KEYS of settle.lua, in its header's order."""
    return [k.leases, k.schedule, k.dead, k.completed, k.wake, k.stats, k.meta, k.fold, k.closed,
            k.ring, k.prios, k.active, k.blocked, k.lanewake, k.events]


def reap_keys(k: Keys) -> list[str]:
    """KEYS of reap.lua, in its header's order."""
    return [k.leases, k.ring, k.wake, k.dead, k.stats, k.meta, k.closed, k.prios, k.active,
            k.blocked, k.lanewake, k.fold, k.events]


def promote_keys(k: Keys) -> list[str]:
    """KEYS of promote.lua, in its header's order."""
    return [k.schedule, k.ring, k.wake, k.stats, k.prios, k.lanewake, k.blocked, k.events]


def promote(client: redis.Redis, k: Keys, batch: int,
            meanwhile: Callable[[], object] | None = None) -> tuple[int, float, float]:
    """Promote due jobs and open rate-limited lanes whose window opened: (promoted jobs and
    opened lanes, next due ms or -1 (the schedule's or a lane window's), server now in ms
    to the microsecond). ``meanwhile`` runs once the call is written and before its reply
    is read (on a cluster, after the reply); it wakes a consumer, so the call rings no
    doorbell."""
    args: list[Arg] = [k.prefix, batch] if meanwhile is None else [k.prefix, batch, "1"]
    if meanwhile is None or is_cluster(client):
        reply = PROMOTE(client, promote_keys(k), args)
        if meanwhile is not None:
            meanwhile()
    else:
        flight = send(client, [(PROMOTE, promote_keys(k), args)])
        try:
            meanwhile()
        finally:
            reply = flight.read()[0]
    promoted, next_due, now, micros = reply
    return int(promoted), float(next_due), int(now) + int(micros) / 1000


def reap(client: redis.Redis, k: Keys, limit: int = 1000) -> tuple[int, int, int, int]:
    """Return expired leases: (requeued, buried, next expiry ms or -1, server now ms)."""
    requeued, buried, nxt, now = REAP(client, reap_keys(k), [k.prefix, limit, "stall"])
    return int(requeued), int(buried), int(nxt), int(now)


def release(client: redis.Redis, k: Keys, held: Sequence[tuple[str, str]], mode: str
            ) -> tuple[int, int]:
    """Return specific leased jobs to their lanes: (requeued, buried)."""
    if not held:
        release_args(k, held, mode)  # still refuses an unknown mode
        return 0, 0
    script, keys, args = release_call(k, held, mode)
    requeued, buried, _, _ = script(client, keys, args)
    return int(requeued), int(buried)


def release_call(k: Keys, held: Sequence[tuple[str, str]], mode: str
                 ) -> tuple[LuaScript, list[str], list[Arg]]:
    """The script call of :func:`release` (for a caller doing its own I/O)."""
    return REAP, reap_keys(k), release_args(k, held, mode)


def release_args(k: Keys, held: Sequence[tuple[str, str]], mode: str) -> list[Arg]:
    """ARGV of the reap script handing back these (job id, token) pairs in ``mode``.

    Raises:
        ValueError: ``mode`` is not "stall", "requeue", "unstarted" or "suspect".
    """
    if mode not in ("stall", "requeue", "unstarted", "suspect"):
        raise ValueError(f"unknown release mode {mode!r}")
    args: list[Arg] = [k.prefix, len(held), mode]
    for job_id, token in held:
        args += [job_id, token]
    return args


RETIRED_LEASES = 10  # a retired claimer's mark outlives its last claim's record (claim.lua)


def retire(client: redis.Redis, k: Keys, claimer: str, lease_ms: int) -> list[Any]:
    """Retire a dead consumer's claimer name (its claims lease nothing from now on) and
    read its claims record, in one call: the record's values (id, token, ...)."""
    return list(RETIRE(client, [k.claims(claimer), k.retired(claimer)],
                       [RETIRED_LEASES * lease_ms]))


def extend(client: redis.Redis, k: Keys, lease_ms: int, held: Sequence[tuple[str, str]]
           ) -> list[bool]:
    """Extend leases still held with these tokens; one flag per pair."""
    if not held:
        return []
    args: list[Arg] = [k.prefix, lease_ms]
    for job_id, token in held:
        args += [job_id, token]
    return [bool(x) for x in EXTEND(client, [k.leases], args)]


def progress(client: redis.Redis, k: Keys, lease_ms: int, job_id: str, token: str,
             value: str) -> bool:
    """Record a running job's progress (JSON text) and extend its lease; False if stale."""
    return bool(PROGRESS(client, [k.leases, k.events], [k.prefix, lease_ms, job_id, token, value]))


def trim_dead(client: redis.Redis, k: Keys, keep_count: int, keep_age_ms: int,
              limit: int = 1000) -> int:
    """Drop dead jobs beyond the retention (-1: no limit); returns how many."""
    return int(TRIM_DEAD(client, [k.dead, k.stats], [k.prefix, keep_count, keep_age_ms, limit]))


def counts_keys(k: Keys) -> list[str]:
    """KEYS of the counts script (shared with the asyncio Queue)."""
    return [k.ring, k.schedule, k.leases, k.dead, k.stats, k.spilled, k.cancelled, k.paused,
            k.prios, k.blocked]


def counts_args(k: Keys, *, fast: bool = False) -> list[str]:
    """ARGV of the counts script; ``fast`` reads waiting from the scripts' counter."""
    return [k.prefix, "fast" if fast else ""]


def counts(client: redis.Redis, k: Keys, *, fast: bool = False) -> list[int]:
    """{waiting, scheduled, active, completed, dead, retried, spilled, lanes, cancelled,
    paused}. ``fast``: waiting from the counter the scripts keep, O(1) at any number of
    lanes."""
    return [int(x) for x in COUNTS(client, counts_keys(k), counts_args(k, fast=fast))]


def await_keys(k: Keys, job_id: str) -> list[str]:
    """KEYS of the await script: the job hash and its result doorbell."""
    return [k.job(job_id), k.done(job_id)]


def retry_dead(client: redis.Redis, k: Keys, ids: Sequence[str], limit: int) -> int:
    """Move the named dead jobs (or up to ``limit`` of them) back to waiting; how many moved."""
    return int(RETRY_DEAD(client, [k.dead, k.ring, k.wake, k.stats, k.prios, k.events],
                          [k.prefix, limit, *ids]))


# --- operations: pause, cancel, listing, purging ---------------------------------

def pause(client: redis.Redis, k: Keys) -> bool:
    """Pause the queue; False when it already was."""
    return bool(PAUSE(client, [k.paused], []))


def resume(client: redis.Redis, k: Keys) -> bool:
    """Resume the queue (ringing when jobs wait); False when it was not paused."""
    return bool(RESUME(client, resume_keys(k), [k.prefix]))


def resume_keys(k: Keys) -> list[str]:
    """KEYS of resume.lua (shared by the sync and the asyncio producer)."""
    return [k.paused, k.ring, k.wake, k.prios]


def cancel(client: redis.Redis, k: Keys, job_id: str) -> Cancelled:
    """Cancel a waiting, scheduled or spilled job; the code says what happened."""
    return Cancelled(int(CANCEL(client, cancel_keys(k), cancel_args(k, job_id))))


def cancel_keys(k: Keys) -> list[str]:
    """KEYS of cancel.lua (shared by the sync and the asyncio producer)."""
    return [k.schedule, k.ring, k.cancelled, k.meta, k.closed, k.stats, k.spilled, k.blocked,
            k.events]


def cancel_args(k: Keys, job_id: str) -> list[Arg]:
    """ARGV of cancel.lua."""
    return [k.prefix, job_id]


def state_source(k: Keys, state: str) -> str:
    """The zset that holds the jobs of a state (waiting jobs live on lanes instead)."""
    return {"waiting": k.ring, "scheduled": k.schedule, "active": k.leases,
            "completed": k.completed, "dead": k.dead, "cancelled": k.cancelled,
            "blocked": k.waitdeps}[state]


def jobs(client: redis.Redis, k: Keys, state: str, cursor: str, limit: int
         ) -> tuple[str, list[list[bytes]]]:
    """One page of a state: (next cursor or "", the jobs' flat HGETALL arrays)."""
    reply = JOBS(client, [k.ring, state_source(k, state), k.prios, k.blocked, k.spilled],
                 [k.prefix, state, cursor, limit])
    head = reply[0]
    return (head.decode() if isinstance(head, bytes) else str(head)), list(reply[1:])


def purge(client: redis.Redis, k: Keys, state: str, limit: int) -> tuple[int, int]:
    """Delete up to ``limit`` of a finished state's oldest jobs: (purged, remaining)."""
    purged, remaining = PURGE(client, [state_source(k, state)], [k.prefix, limit])
    return int(purged), int(remaining)


def set_limit(client: redis.Redis, k: Keys, lane: str, value: str) -> int:
    """Set (or clear, with "") a lane's flow limits, "*" the queue default; put the lane
    (every lane for "*") back on the rings a limit took it off. Returns how many entries."""
    return int(LIMIT(client, limit_keys(k), [k.prefix, lane, value]))


def limit_keys(k: Keys) -> list[str]:
    """KEYS of limit.lua (shared by the sync and the asyncio producer)."""
    return [k.limits, k.blocked, k.lanewake, k.ring, k.wake, k.active]


def survey(client: redis.Redis, k: Keys, scan: int, top: int, heads: int
           ) -> tuple[int, int, int, int, list[tuple[str, int]]]:
    """(lanes, lanes scanned, oldest created_ms of the first ``heads`` lanes' head jobs or
    -1, server now ms, [(lane, waiting)] longest first)."""
    reply = SURVEY(client, [k.ring], [k.prefix, scan, top, heads])
    pairs = reply[4:]
    lanes = [((pairs[i].decode() if isinstance(pairs[i], bytes) else str(pairs[i])),
              int(pairs[i + 1])) for i in range(0, len(pairs), 2)]
    return int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]), lanes
