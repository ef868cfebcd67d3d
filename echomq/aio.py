"""The asyncio producer: ``await aq.add / add_many / get / counts / result``.

Same Lua scripts and key layout as :class:`echomq.Queue`; the jobs are
validated and the script calls built by the sync Queue's pure methods, and
only sending and awaiting happen here, so the two cannot drift apart.
Concurrent ``add`` calls are coalesced: calls made while an admit is in
flight are sent together as the next one (one script call admits many jobs),
so 100 producers on one loop cost about one round trip per batch, not one
each; a lone ``add`` still costs a single round trip. Commands share a
bounded pool; each result waiter parks on a connection of its own from a
second pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

from echomq import results, scripts
from echomq.backoff import Backoff
from echomq.config import QueueSettings
from echomq.connection import DEFAULT_URL, redact_url, translated
from echomq.errors import ConnectionFailed, JobFailed, JobNotFound
from echomq.job import STATES, Job
from echomq.keys import validate_job_id
from echomq.queue import Queue as SyncQueue

COMMAND_CONNECTIONS = 32  # a bounded pool for commands
ADMIT_COALESCE = 500  # at most this many concurrent adds per admit round trip
Spec = tuple[str, list[Any], "int | None"]

# the planner's client is never used for I/O; it lets the sync Queue build calls
_PLANNER_CLIENT = redis.Redis()


def client_from_url(url: str, **options: Any) -> redis.asyncio.Redis:
    """A redis.asyncio client for ``url`` whose pool waits for a free connection."""
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 10.0)
    options.setdefault("max_connections", COMMAND_CONNECTIONS)
    options.setdefault("timeout", None)  # wait for a connection as long as it takes
    try:
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, **options)
    except ValueError as exc:
        raise ConnectionFailed(f"invalid Redis URL {redact_url(url)}: {exc}") from None
    return redis.asyncio.Redis(connection_pool=pool)


class Queue:
    """A named queue, for asyncio code. ``Queue("emails", redis_url=...)`` or ``redis=client``."""

    def __init__(
        self,
        name: str,
        redis_url: str | None = None,
        *,
        redis: redis.asyncio.Redis | None = None,
        settings: QueueSettings | None = None,
        **overrides: Any,
    ) -> None:
        self._plan = SyncQueue(name, redis=_PLANNER_CLIENT, settings=settings, **overrides)
        self.name = self._plan.name
        self.keys = self._plan.keys
        self.settings = self._plan.settings
        self._owns_pool = redis is None
        if redis is not None:
            self.redis = redis
            kwargs = redis.connection_pool.connection_kwargs
            self.where = f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        else:
            url = redis_url or DEFAULT_URL
            self.redis = client_from_url(url)
            self.where = redact_url(url)
        pool = self.redis.connection_pool
        # waiters park on connections of their own, never holding a command connection
        self._waiters = redis_asyncio_pool(pool)
        self._pending: list[tuple[Spec, asyncio.Future[None]]] = []
        self._admitting: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"aio.Queue({self.name!r}, {self.where})"

    async def add(
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
        timeout: float | None = None,
        dedup_s: float | None = None,
        priority: int = 0,
    ) -> str:
        """Admit one job and return its id; see :meth:`echomq.Queue.add`."""
        spec = self._plan._spec(name, payload, lane, delay, run_at, job_id, max_attempts,
                                backoff, timeout, dedup_s, priority)
        done = asyncio.get_running_loop().create_future()
        self._pending.append((spec, done))
        if self._admitting is None:
            self._admitting = asyncio.create_task(self._admit_pending())
        await done
        return spec[0]

    async def _admit_pending(self) -> None:
        """Admit what add() queued, batch after batch, until nothing is left."""
        try:
            while self._pending:
                batch = self._pending[:ADMIT_COALESCE]
                del self._pending[:len(batch)]
                try:
                    calls = self._plan._calls([s for s, _ in batch])
                    with translated(self.where):
                        if len(calls) == 1:
                            await evalsha(self.redis, *calls[0])
                        else:
                            await execute(self.redis, calls)
                except Exception as exc:
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                else:
                    for _, done in batch:
                        if not done.done():
                            done.set_result(None)
        finally:
            self._admitting = None

    async def add_many(self, jobs: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[str]:
        """Admit many jobs in one round trip; see :meth:`echomq.Queue.add_many`."""
        specs = self._plan._specs(jobs)
        if specs:
            with translated(self.where):
                await execute(self.redis, self._plan._calls(specs))
        return [s[0] for s in specs]

    async def get(self, job_id: str) -> Job | None:
        """The job with this id, or None."""
        validate_job_id(job_id)
        with translated(self.where):
            raw = await self.redis.hgetall(self.keys.job(job_id))
        return Job.from_hash(self.name, raw) if raw else None  # type: ignore[arg-type]

    async def counts(self) -> dict[str, int]:
        """Jobs per state, as :meth:`echomq.Queue.counts`."""
        with translated(self.where):
            values = await evalsha(self.redis, scripts.COUNTS, scripts.counts_keys(self.keys),
                                   scripts.counts_args(self.keys))
        return dict(zip(STATES, (int(v) for v in values[:len(STATES)]), strict=True))

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for the job's return value; see :meth:`echomq.Queue.result`."""
        with translated(self.where):
            return await wait(self._waiters, self.keys, job_id, timeout)

    async def close(self) -> None:
        await self.redis.aclose()
        if self._owns_pool:
            await self.redis.connection_pool.disconnect()
        await self._waiters.disconnect()


def redis_asyncio_pool(pool: Any) -> redis.asyncio.ConnectionPool:
    """An unbounded pool to the same server as ``pool``."""
    return redis.asyncio.ConnectionPool(connection_class=pool.connection_class,
                                        max_connections=results.WAITERS_MAX,
                                        **pool.connection_kwargs)


async def evalsha(client: redis.asyncio.Redis, script: scripts.LuaScript,
                  keys: Sequence[str], args: Sequence[scripts.Arg]) -> Any:
    """Run one script by SHA, loading it on NOSCRIPT."""
    try:
        return await client.evalsha(script.sha, script.num_keys, *keys, *args)
    except redis.exceptions.NoScriptError:
        await client.script_load(script.source)
        return await client.evalsha(script.sha, script.num_keys, *keys, *args)


async def execute(client: redis.asyncio.Redis,
                  calls: Sequence[tuple[scripts.LuaScript, Sequence[str], Sequence[scripts.Arg]]]
                  ) -> list[Any]:
    """Script calls in one pipeline; a call refused with NOSCRIPT is re-run alone."""
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.evalsha(script.sha, script.num_keys, *keys, *args)
    replies = await pipe.execute(raise_on_error=False)
    for i, reply in enumerate(replies):
        if isinstance(reply, redis.exceptions.NoScriptError):
            script, keys, args = calls[i]
            replies[i] = await evalsha(client, script, keys, args)
        elif isinstance(reply, Exception):
            raise reply
    return list(replies)


async def wait(waiters: redis.asyncio.ConnectionPool, keys: Any, job_id: str,
               timeout: float | None) -> Any:
    """The asyncio twin of :func:`echomq.results.wait`, on one connection of ``waiters``."""
    validate_job_id(job_id)
    timeout = results.check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    doorbell = keys.done(job_id)
    conn = await waiters.get_connection()  # type: ignore[no-untyped-call]
    try:
        while True:
            mark = deadline is None or deadline > time.monotonic()
            reply = await _await(conn, scripts.await_keys(keys, job_id), mark)
            result = results.outcome(job_id, reply)
            if result is not results.PENDING:
                return result
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise results.timed_out(job_id, timeout)
            if not await _park(conn, doorbell, remaining) and deadline is not None:
                # one last read, as the sync waiter does
                last = results.outcome(
                    job_id, await _await(conn, scripts.await_keys(keys, job_id), False))
                if last is not results.PENDING:
                    return last
                raise results.timed_out(job_id, timeout)
    except (JobFailed, JobNotFound, TimeoutError):
        raise  # answers read in full: the connection is clean
    except BaseException:  # cancelled or failed: a reply may still come, never reuse
        await conn.disconnect()
        raise
    finally:
        await waiters.release(conn)


async def _await(conn: Any, keys: list[str], mark: bool) -> Any:
    script = scripts.AWAIT
    command = ["EVALSHA", script.sha, script.num_keys, *keys, "1" if mark else "0"]
    await conn.send_command(*command)
    try:
        return await conn.read_response()
    except redis.exceptions.NoScriptError:
        await conn.send_command("SCRIPT", "LOAD", script.source)
        await conn.read_response()
        await conn.send_command(*command)
        return await conn.read_response()


async def _park(conn: Any, key: str, remaining: float | None) -> bool:
    command, read_timeout = results.block_args(key, remaining)
    await conn.send_command(*command)
    reply = await conn.read_response(timeout=read_timeout)
    if reply is None:
        # redis.asyncio answers None both for the server's nil and for our own read
        # deadline, when the call is still parked there: drop it with the socket
        await conn.disconnect()
        return False
    return True
