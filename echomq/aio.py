"""The asyncio producer: ``await aq.add / add_many / get / counts / result``.

Same Lua scripts and key layout as :class:`echomq.Queue`; the jobs are
validated and the script calls built by :class:`echomq.admit.AdmitPlanner`, as
the sync Queue builds them, and only sending and awaiting happen here, so the
two cannot drift apart.
Concurrent ``add`` calls are coalesced: calls made while an admit is in
flight are sent together as the next one (one script call admits many jobs),
so 100 producers on one loop cost about one round trip per batch, not one
each; a lone ``add`` still costs a single round trip. Commands share a
bounded pool; each result waiter parks on a connection of its own from a
second pool.

The durability dial is honoured as :class:`echomq.Queue` honours it: on a "sync"
queue a deferred job's row is on the floor before its ``add`` returns, and a
producer without a floor refuses before admitting. The floor is SQLAlchemy's
sync engine, shared with the sync producer; its write runs on a worker thread
(``asyncio.to_thread``), once per coalesced batch, so the loop never blocks on
SQL and the floor keeps one code path (no async driver to install or to keep in
step with the sync one's statement and timeout settings).

On a cluster (a URL naming a cluster node, see :mod:`echomq.connection`) the
client is a ``redis.asyncio.RedisCluster``: every call of a queue touches its
one hash-tagged slot and goes to the node that owns it, a script missing there
(NOSCRIPT) is loaded on that node alone, and result waiters park on that node,
following a MOVED after a failover or a slot move.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

from echomq import (
    aiocontrol,
    cron,
    depend,
    durable,
    events,
    pools,
    protocol,
    results,
    scripts,
    stopping,
)
from echomq.admit import AdmitPlanner, Spec, added, deferred_ids, has_deferred, refuse_mixed
from echomq.backoff import Backoff
from echomq.config import QueueSettings
from echomq.connection import (
    AsyncRefusalParser,
    async_cluster_from_url,
    async_node_of,
    check_password_encoded,
    cluster_mode,
    is_async_cluster,
    redact_url,
    translated,
)
from echomq.errors import ConnectionFailed, JobFailed, JobNotFound
from echomq.events import Event
from echomq.job import Job
from echomq.keys import REGISTRY, validate_job_id, validate_name
from echomq.middleware import hooks_of
from echomq.packing import pack_commands
from echomq.queue import Queue as SyncQueue
from echomq.queue import backfill_args, limit_value
from echomq.tracing import note_message_id, producer_span

COMMAND_CONNECTIONS = 32  # a bounded pool for commands
CLUSTER_CONNECTIONS = 256  # per cluster node: redis-py's cluster pool refuses past it
REDIRECTS = 5  # a result waiter follows at most this many MOVED replies in a row
ADMIT_COALESCE = 500  # at most this many concurrent adds per admit round trip


def client_from_url(url: str, **options: Any) -> Any:
    """A redis.asyncio client for ``url`` whose pool waits for a free connection; for a
    cluster node's URL a ``redis.asyncio.RedisCluster`` (``CLUSTER_CONNECTIONS`` per node,
    redis-py's cluster pools do not wait: a call past them fails)."""
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 10.0)
    check_password_encoded(url)
    try:
        if cluster_mode(url, options):
            options.setdefault("max_connections", CLUSTER_CONNECTIONS)
            return async_cluster_from_url(url, **options)
        options.setdefault("max_connections", COMMAND_CONNECTIONS)
        options.setdefault("timeout", None)  # wait for a connection as long as it takes
        options.setdefault("parser_class", AsyncRefusalParser)
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, **options)
    except ValueError as exc:
        raise ConnectionFailed(f"invalid Redis URL {redact_url(url)}: {exc}") from None
    return redis.asyncio.Redis(connection_pool=pool)


class Queue:
    """A named queue, for asyncio code. ``Queue("emails", redis_url=...)`` or ``redis=client``.

    ``floor=echomq.floor.Floor.from_url(URL)``: needed to add deferred jobs to a queue
    whose durability dial is "sync" (see :meth:`echomq.Queue.add`).
    """

    def __init__(
        self,
        name: str,
        redis_url: str | None = None,
        *,
        redis: Any = None,
        settings: QueueSettings | None = None,
        floor: Any = None,
        middleware: Sequence[Any] = (),
        **overrides: Any,
    ) -> None:
        self.name = validate_name(name)
        # an echomq.floor.Floor (or its URL): when the queue's dial is "sync", add() writes
        # deferred jobs to it before returning (as echomq.Queue does); "durable": every job
        self.floor = durable.as_floor(floor)
        self.middleware = list(middleware)  # before_add (awaited when async def)
        self._hooks = hooks_of(self.middleware)
        self.settings = (settings or pools.default_settings()).with_overrides(**overrides)
        self._plan = AdmitPlanner(self.name, self.settings)  # what an admit sends
        self.keys = self._plan.keys
        self._owns_pool = redis is None
        if redis is not None:
            self.redis = redis
            self.where = _describe(redis)
        else:
            url = redis_url or pools.default_url()
            self.redis = client_from_url(url)
            self.where = redact_url(url)
        self.cluster = is_async_cluster(self.redis)
        # waiters park on connections of their own, never holding a command connection;
        # on a cluster one pool per node, made when a waiter first parks there
        self._waiters = None if self.cluster else redis_asyncio_pool(self.redis.connection_pool)
        self._node_waiters: dict[str, redis.asyncio.ConnectionPool] = {}
        self._pending: list[tuple[Spec, bool, asyncio.Future[None]]] = []
        self._admitting: asyncio.Task[None] | None = None
        self._dial_reading: asyncio.Task[None] | None = None
        self._writing: set[asyncio.Task[None]] = set()  # floor writes under way
        self._registered = False
        self._protocol_read = False  # the meta's protocol version was read and accepted

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
        tx: Any = None,
        after: Iterable[str] | None = None,
        on_dep_failure: str = "fail",
        expires: float | datetime | None = None,
        debounce: str | None = None,
        debounce_s: float | None = None,
        debounce_max_s: float | None = None,
    ) -> str:
        """Admit one job and return its id; see :meth:`echomq.Queue.add` (``tx``: an
        AsyncConnection or AsyncSession, the outbox)."""
        debounced = debounce is not None or debounce_s is not None or debounce_max_s is not None
        refuse_mixed(tx is not None, after is not None or on_dep_failure != "fail",
                     expires is not None, debounced)
        with producer_span(self.name, "add") as span:
            if expires is not None or debounced:
                if self._hooks is not None:  # a debounced add's job is the server's pick
                    await self._hooks.before_add_async(self.name, job_id, name, payload)
                jid = await aiocontrol.add(
                    self, name, payload, expires=expires, debounce=debounce,
                    debounce_s=debounce_s, debounce_max_s=debounce_max_s, lane=lane,
                    delay=delay, run_at=run_at, job_id=job_id, max_attempts=max_attempts,
                    backoff=backoff, timeout=timeout, dedup_s=dedup_s, priority=priority)
                note_message_id(span, jid)
                return jid
            spec = self._plan.spec(name, payload, lane, delay, run_at, job_id, max_attempts,
                                   backoff, timeout, dedup_s, priority)
            if self._hooks is not None:
                await self._hooks.before_add_async(self.name, spec[0], name, payload)
            note_message_id(span, spec[0])
            if tx is not None:
                await durable.to_outbox_async(tx, self.name, [spec])
                return spec[0]
            if after is not None or on_dep_failure != "fail":
                deps = depend.dependencies([] if after is None else after, on_dep_failure)
                return (await self.add_blocked([spec], [(deps, on_dep_failure)]))[0]
            sync = await self._floor_sync([spec])
            done = asyncio.get_running_loop().create_future()
            self._pending.append((spec, sync, done))
            if self._admitting is None:
                self._admitting = asyncio.create_task(self._admit_pending())
            await done
        return spec[0]

    async def _admit_pending(self) -> None:
        """Admit what add() queued, batch after batch, until nothing is left. The adds of
        a batch whose jobs must reach the floor are answered once the floor holds them."""
        try:
            while self._pending:
                batch = self._pending[:ADMIT_COALESCE]
                del self._pending[:len(batch)]
                try:
                    calls = self._plan.calls([s for s, _, _ in batch])
                    await self._register()
                    with translated(self.where):
                        if len(calls) == 1:
                            await evalsha(self.redis, *calls[0])
                        else:
                            await execute(self.redis, calls)
                except Exception as exc:
                    for _, _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                for _, sync, done in batch:
                    if not sync and not done.done():
                        done.set_result(None)
                synced = [(spec, done) for spec, sync, done in batch if sync]
                if synced:  # off this loop, so the next batch's admit does not wait for SQL
                    task = asyncio.create_task(self._answer_after_floor(synced))
                    self._writing.add(task)
                    task.add_done_callback(self._writing.discard)
        finally:
            self._admitting = None

    async def _answer_after_floor(self, synced: list[tuple[Spec, asyncio.Future[None]]]
                                  ) -> None:
        """Write these admitted jobs through to the floor, then answer their adds."""
        try:
            await self._write_through([spec for spec, _ in synced])
        except Exception as exc:
            for _, done in synced:
                if not done.done():
                    done.set_exception(exc)
        else:
            for _, done in synced:
                if not done.done():
                    done.set_result(None)

    async def add_many(self, jobs: Iterable[Sequence[Any] | Mapping[str, Any]], *,
                       tx: Any = None) -> list[str]:
        """Admit many jobs in one round trip; see :meth:`echomq.Queue.add_many`."""
        jobs, deps = depend.split(jobs)  # (echomq.depend)
        with producer_span(self.name, "add_many", len(jobs)):
            expiries: dict[int, int] = {}
            specs = self._plan.specs(jobs, expiries)
            blocked = any(d is not None for d in deps)
            if expiries:
                refuse_mixed(tx is not None, blocked, True)
            if self._hooks is not None:
                for job_id, name, payload in added(specs):
                    await self._hooks.before_add_async(self.name, job_id, name, payload)
            if specs and tx is not None:
                refuse_mixed(tx=True, after=blocked)
                await durable.to_outbox_async(tx, self.name, specs)
            elif blocked:
                return await self.add_blocked(specs, deps)
            elif specs:
                sync = await self._floor_sync(specs)
                await self._register()
                with translated(self.where):
                    if expiries:  # marked in the admit's transaction: no claim between
                        for group in self._plan.marked_calls(specs, expiries):
                            await execute_atomically(self.redis, group)
                    else:
                        await execute(self.redis, self._plan.calls(specs))
                if sync:
                    await self._write_through(specs)
        return [s[0] for s in specs]

    async def add_blocked(self, specs: Sequence[Spec],
                          deps: Sequence[tuple[list[str], str] | None]) -> list[str]:
        """Admit validated jobs, some with dependencies; see
        :meth:`echomq.Queue.add_blocked`."""
        calls = depend.plan(self.keys, specs, deps, self._plan.calls)
        sync = await self._floor_sync(specs)
        await self._register()
        with translated(self.where):
            try:
                if len(calls) == 1:
                    await execute(self.redis, calls)
                else:  # whole before any of its jobs can run and end (retention included)
                    await execute_atomically(self.redis, calls)
            except redis.exceptions.ResponseError as exc:
                raise depend.translate(exc) from None
        if sync:
            await self._write_through(specs, deps)
        return [s[0] for s in specs]

    async def _floor_sync(self, specs: Sequence[Spec], *, deferred: bool | None = None
                          ) -> bool:
        """The asyncio side of :meth:`echomq.Queue.floor_sync`: the dial is read from the
        queue's meta at most every DIAL_TTL_S, by one read that concurrent adds share.
        ``deferred``: whether the jobs include deferred ones, when ``specs`` cannot tell (a
        debounced job, whose spec the server builds).

        Raises:
            ConfigError: the dial says "sync" and this producer has no floor.
        """
        own = self.settings.durability
        every = self.floor is not None or own is not None  # "durable" may put every job there
        later = has_deferred(specs) if deferred is None else deferred
        if not every and not later:
            return False  # only deferred jobs go to the floor: the dial is not even read
        if self._plan.dial_stale():
            if self._dial_reading is None:
                self._dial_reading = asyncio.create_task(self._read_dial())
            await asyncio.shield(self._dial_reading)  # a cancelled add leaves it to the rest
        if durable.is_durable(self._plan.dial(), own):
            durable.require_floor(self.name, self.floor)
            return True
        return later and self._plan.floor_sync(self._plan.dial(), self.floor is not None)

    async def _read_dial(self) -> None:
        try:
            with translated(self.where):
                self._plan.note_dial(await self.redis.hget(self.keys.meta, "durability"))
        finally:
            self._dial_reading = None

    async def _write_through(self, specs: Sequence[Spec],
                             deps: Sequence[tuple[list[str], str] | None] | None = None
                             ) -> None:
        """Durability "sync": the admitted deferred jobs among ``specs``, read back from
        Valkey as :func:`echomq.floor.writethrough.write_through` reads them, are on the
        floor when this returns. The SQL runs on a worker thread."""
        if durable.is_durable(self._plan.dial(), self.settings.durability):
            # "durable": every job of the batch, one commit for the adds that share it
            await durable.write_admitted_async(self.redis, self.keys, self.floor, specs,
                                               deps)
            return
        from echomq.floor.writethrough import scheduled_rows

        ids = deferred_ids(specs)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        with translated(self.where):
            hashes = await pipe.execute()
        rows = scheduled_rows(ids, hashes)
        await asyncio.to_thread(self.floor.write_through, self.keys.queue, rows)

    async def _write_current(self, job_id: str) -> None:
        """The asyncio side of :func:`echomq.floor.writethrough.write_current` (the SQL on
        a worker thread)."""
        from echomq.floor.writethrough import CURRENT_TRIES, current_row

        with translated(self.where):
            raw = await self.redis.hgetall(self.keys.job(job_id))
        for _ in range(CURRENT_TRIES):
            row = current_row(job_id, raw)
            if row is None:
                return
            await asyncio.to_thread(self.floor.write_through, self.keys.queue, [row])
            with translated(self.where):
                again = await self.redis.hgetall(self.keys.job(job_id))
            if again == raw:
                return
            raw = again

    async def _register(self) -> None:
        """Add this queue to the registry ``echomq queues`` reads (once per Queue)."""
        if not self._registered:
            with translated(self.where):
                await protocol.aclaim(self.redis, self.keys)  # ProtocolMismatch before writes
                self._protocol_read = True
                await self.redis.sadd(REGISTRY, self.name)
            self._registered = True

    async def _check_protocol(self) -> None:
        """At first read: ProtocolMismatch for another MAJOR version (reads record nothing)."""
        if not self._protocol_read:
            with translated(self.where):
                protocol.check(self.name, await self.redis.hget(self.keys.meta, protocol.FIELD))
            self._protocol_read = True

    async def get(self, job_id: str) -> Job | None:
        """The job with this id, or None."""
        validate_job_id(job_id)
        await self._check_protocol()
        with translated(self.where):
            raw = await self.redis.hgetall(self.keys.job(job_id))
        return Job.from_hash(self.name, raw) if raw else None  # type: ignore[arg-type]

    async def counts(self) -> dict[str, int]:
        """Jobs per state, as :meth:`echomq.Queue.counts`."""
        await self._check_protocol()
        with translated(self.where):
            values = await evalsha(self.redis, scripts.COUNTS, scripts.counts_keys(self.keys),
                                   scripts.counts_args(self.keys))
        return SyncQueue._counts_of([int(v) for v in values])

    async def cancel(self, job_id: str) -> bool:
        """Cancel a waiting, scheduled or active job; see :meth:`echomq.Queue.cancel`."""
        validate_job_id(job_id)
        with translated(self.where):
            answer = await evalsha(self.redis, scripts.CANCEL, scripts.cancel_keys(self.keys),
                                   scripts.cancel_args(self.keys, job_id))
            if int(answer) == scripts.Cancelled.ACTIVE:
                answer = await evalsha(self.redis, stopping.STOP, stopping.stop_keys(self.keys),
                                       stopping.stop_args(self.keys, job_id))
            done = scripts.Cancelled(int(answer)) is scripts.Cancelled.CANCELLED
            if done and self.floor is not None:  # the row goes before we return, as in Queue
                rows = await asyncio.to_thread(self.floor.rows, self.name, [job_id])
                if rows and await self.redis.hget(self.keys.job(job_id), "spilled"):
                    await evalsha(self.redis, scripts.BACKFILL, [self.keys.cancelled],
                                  backfill_args(self.keys, rows))
                if rows:
                    await asyncio.to_thread(self.floor.close_jobs, self.name, [job_id], None)
        return done

    async def events(self, since: str = "0", block_s: float | None = 1.0
                     ) -> AsyncIterator[Event]:
        """The queue's job events; see :meth:`echomq.Queue.events`."""
        async for event in events.aread(self.redis, self.keys, since, block_s):
            yield event

    async def set_events(self, enabled: bool, max_len: int | None = None) -> None:
        """Turn the event stream on or off; see :meth:`echomq.Queue.set_events`."""
        key, mapping = events.set_events(self.redis, self.keys, enabled, max_len)
        with translated(self.where):
            await self.redis.hset(key, mapping=mapping)

    async def pause(self) -> bool:
        """Stop handing out jobs; False if already paused. See :meth:`echomq.Queue.pause`."""
        with translated(self.where):
            await self.redis.sadd(REGISTRY, self.name)
            return bool(await evalsha(self.redis, scripts.PAUSE, [self.keys.paused], []))

    async def resume(self) -> bool:
        """Hand out jobs again; False if it was not paused. See :meth:`echomq.Queue.resume`."""
        with translated(self.where):
            return bool(await evalsha(self.redis, scripts.RESUME, scripts.resume_keys(self.keys),
                                      [self.keys.prefix]))

    async def set_queue_limit(self, max_active: int | None = None, rate: int | None = None,
                              per_s: float | None = None) -> None:
        """Limit the whole queue; see :meth:`echomq.Queue.set_queue_limit`."""
        await aiocontrol.set_queue_limit(self, limit_value(max_active, rate, per_s))

    async def set_lane_limit(self, lane: str, max_active: int | None = None,
                             rate: int | None = None, per_s: float | None = None) -> None:
        """Limit one lane (``"*"``: the queue default); see :meth:`echomq.Queue.set_lane_limit`.
        """
        value = limit_value(max_active, rate, per_s)
        if lane != "*":
            validate_name(lane, "lane name")
        await self._register()
        with translated(self.where):
            await evalsha(self.redis, scripts.LIMIT, scripts.limit_keys(self.keys),
                          [self.keys.prefix, lane, value])

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for the job's return value; see :meth:`echomq.Queue.result`."""
        await self._check_protocol()
        with translated(self.where):
            if not self.cluster:
                assert self._waiters is not None
                return await wait(self._waiters, self.keys, job_id, timeout)
            timeout = results.check_timeout(timeout)
            deadline = None if timeout is None else time.monotonic() + timeout
            for _ in range(REDIRECTS):
                pool = await self._waiters_on_owner()
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return await wait(pool, self.keys, job_id, left, shown_timeout=timeout)
                except redis.exceptions.MovedError:
                    # a failover or a slot move: read the slot map again, park on the new owner
                    await self.redis.nodes_manager.initialize()
            raise redis.exceptions.TryAgainError(
                f"queue {self.name}: its slot kept moving while waiting for job {job_id}")

    async def _waiters_on_owner(self) -> redis.asyncio.ConnectionPool:
        """The waiter pool of the cluster node owning this queue's slot."""
        node = await async_node_of(self.redis, self.keys.prefix)
        pool = self._node_waiters.get(node.name)
        if pool is None:
            pool = self._node_waiters[node.name] = redis.asyncio.ConnectionPool(
                connection_class=node.connection_class, max_connections=results.WAITERS_MAX,
                **node.connection_kwargs)
        return pool

    async def add_cron(self, key: str, expr: str, name: str, payload: Any = None,
                       lane: str | None = None, tz: str = "UTC") -> cron.Cron:
        """Add or replace a cron; see :meth:`echomq.Queue.add_cron` (no floor here: the
        scheduler writes the cron to its floor)."""
        spec = self._plan.cron_spec(key, expr, name, payload, lane, tz)
        with translated(self.where):
            await self.redis.sadd(REGISTRY, self.name)
            _, last = await evalsha(self.redis, scripts.CRON_SET, cron.set_keys(self.keys),
                                    [spec.key, spec.encode()])
        return spec.public(int(last), cron.next_after(spec.expr, spec.tz, int(last)))

    async def remove_cron(self, key: str) -> bool:
        """Stop a cron; see :meth:`echomq.Queue.remove_cron`."""
        cron.validate_key(key)
        with translated(self.where):
            return bool(await evalsha(self.redis, scripts.CRON_REMOVE,
                                      cron.remove_keys(self.keys), [key]))

    async def crons(self) -> list[cron.Cron]:
        """The queue's crons; see :meth:`echomq.Queue.crons`."""
        with translated(self.where):
            specs = await self.redis.hgetall(self.keys.crons)
            lasts = await self.redis.hgetall(self.keys.cronlast)
        return cron.parse_listing(specs, lasts)

    async def close(self) -> None:
        """Close this queue's connections (and its client, when the queue made it)."""
        await self.redis.aclose()
        if self.cluster:
            await close_node_clients(self.redis)
        elif self._owns_pool:
            await self.redis.connection_pool.disconnect()
        for pool in [self._waiters, *self._node_waiters.values()]:
            if pool is not None:
                await pool.disconnect()


def _describe(client: Any) -> str:
    """Where a given asyncio client connects, without its password."""
    if is_async_cluster(client):
        nodes = sorted(node.name for node in client.startup_nodes)
        return f"cluster {', '.join(nodes)}"
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def redis_asyncio_pool(pool: Any) -> redis.asyncio.ConnectionPool:
    """An unbounded pool to the same server as ``pool``."""
    return redis.asyncio.ConnectionPool(connection_class=pool.connection_class,
                                        max_connections=results.WAITERS_MAX,
                                        **pool.connection_kwargs)


async def evalsha(client: Any, script: scripts.LuaScript,
                  keys: Sequence[str], args: Sequence[scripts.Arg]) -> Any:
    """Run one script by SHA, loading it on NOSCRIPT (on a cluster: on the node owning
    the first key's slot, where the call goes)."""
    try:
        if type(client) is redis.asyncio.Redis and client.connection is None:
            return await _direct(client, script.sha, script.num_keys, keys, args)
        return await client.evalsha(script.sha, script.num_keys, *keys, *args)
    except redis.exceptions.NoScriptError:
        await load(client, script, keys[0] if keys else None)
        return await client.evalsha(script.sha, script.num_keys, *keys, *args)


async def _direct(client: redis.asyncio.Redis, sha: str, num_keys: int, keys: Sequence[str],
                  args: Sequence[scripts.Arg]) -> Any:
    """One EVALSHA on a pooled connection without redis-py's per-command wrapping, as
    :func:`echomq.scripts._direct` does for the sync client: a client whose calls
    redis-py retries takes redis-py's own path; otherwise a connection or timeout error
    closes the connection and is raised, the call never sent twice. A cancelled call
    leaves no reply unread: redis-py closes a connection whose read or write an
    exception interrupted."""
    pool = client.connection_pool
    conn = await pool.get_connection()
    if conn.retry.get_retries():
        await pool.release(conn)
        return await client.evalsha(sha, num_keys, *keys, *args)
    try:
        await conn.send_packed_command(
            pack_commands(conn, [("EVALSHA", sha, num_keys, *keys, *args)]))
        return await conn.read_response()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)


async def load(client: Any, script: scripts.LuaScript, key: str | None) -> None:
    """SCRIPT LOAD ``script``: on a cluster on the node owning ``key`` (every primary when
    there is no key), else on the one server."""
    if key is not None and is_async_cluster(client):
        node = await async_node_of(client, key)
        await client.execute_command("SCRIPT LOAD", script.source, target_nodes=node)
    else:
        await client.script_load(script.source)


async def execute(client: Any,
                  calls: Sequence[tuple[scripts.LuaScript, Sequence[str], Sequence[scripts.Arg]]],
                  *, raise_errors: bool = True) -> list[Any]:
    """Script calls in one pipeline (one round trip per node); a call refused with NOSCRIPT
    is re-run alone after loading the script. A call that fails raises its error, unless
    ``raise_errors`` is False: then its error is its reply, and the other calls' replies
    are kept (a pipeline that fails as a whole still raises).

    On a cluster redis-py's pipeline refuses EVALSHA, so the calls go in one plain pipeline
    per owning node; a call answered with MOVED, ASK, TRYAGAIN or CLUSTERDOWN did not run
    and is re-run alone through the cluster client, which follows the redirect.
    """
    if not is_async_cluster(client):
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, script.num_keys, *keys, *args)
        replies = list(await pipe.execute(raise_on_error=False))
    else:
        replies = await _execute_on_nodes(client, calls)
    for i, reply in enumerate(replies):
        if isinstance(reply, scripts.NOT_RUN + (redis.exceptions.MovedError,)):
            script, keys, args = calls[i]
            try:
                replies[i] = await evalsha(client, script, keys, args)
            except redis.exceptions.RedisError as exc:
                if raise_errors:
                    raise
                replies[i] = exc
        elif isinstance(reply, Exception) and raise_errors:
            raise reply
    return replies


async def execute_atomically(client: Any, calls: Sequence[
        tuple[scripts.LuaScript, Sequence[str], Sequence[scripts.Arg]]]) -> list[Any]:
    """The asyncio twin of :func:`echomq.scripts.execute_atomically`: the calls of one
    queue in one MULTI/EXEC (its node's, on a cluster), run again whole after a script
    was loaded; a call's error is raised."""
    target = client
    if is_async_cluster(client):
        target = node_client(client, await async_node_of(client, calls[0][1][0]))
    distinct = list({script.sha: script for script, _, _ in calls}.values())
    preload = distinct if len(distinct) > 1 else []  # see the sync twin
    for attempt in range(2):
        pipe = target.pipeline(transaction=True)
        for script in preload:
            pipe.script_load(script.source)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, script.num_keys, *keys, *args)
        results = (await pipe.execute(raise_on_error=False))[len(preload):]
        missing = [c for c, r in zip(calls, results, strict=True)
                   if isinstance(r, redis.exceptions.NoScriptError)]
        if not missing or attempt:
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return list(results)
        for script, keys, _ in missing:  # idempotent calls: the transaction runs again
            await load(client, script, keys[0])
    raise AssertionError("unreachable")


async def _execute_on_nodes(client: Any, calls: Sequence[
        tuple[scripts.LuaScript, Sequence[str], Sequence[scripts.Arg]]]) -> list[Any]:
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (_, keys, _) in enumerate(calls):
        node = await async_node_of(client, keys[0])
        groups.setdefault(node.name, (node, []))[1].append(i)
    replies: list[Any] = [None] * len(calls)

    async def send(node: Any, indexes: list[int]) -> None:
        pipe = node_client(client, node).pipeline(transaction=False)
        for i in indexes:
            script, keys, args = calls[i]
            pipe.evalsha(script.sha, script.num_keys, *keys, *args)
        try:
            answers = await pipe.execute(raise_on_error=False)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            # the node is gone (a failover?): read the slot map again for the next call
            with contextlib.suppress(redis.exceptions.RedisError,
                                     redis.exceptions.RedisClusterException):
                await client.nodes_manager.initialize()
            raise
        for i, answer in zip(indexes, answers, strict=True):
            replies[i] = answer

    await asyncio.gather(*(send(node, indexes) for node, indexes in groups.values()))
    return replies


# plain clients of each cluster node, for pipelines of EVALSHA; per cluster client, since
# both belong to the event loop that uses them
_node_clients: weakref.WeakKeyDictionary[Any, dict[str, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary())


def node_client(client: Any, node: Any) -> redis.asyncio.Redis:
    """A plain asyncio client of one cluster node (a bounded pool of its own)."""
    clients = _node_clients.setdefault(client, {})
    found = clients.get(node.name)
    if found is None:
        kwargs = {k: v for k, v in node.connection_kwargs.items()
                  if k not in ("redis_connect_func",)}
        found = clients[node.name] = redis.asyncio.Redis(
            connection_pool=redis.asyncio.BlockingConnectionPool(
                connection_class=node.connection_class, max_connections=COMMAND_CONNECTIONS,
                timeout=None, **kwargs))
    return found


async def close_node_clients(client: Any) -> None:
    """Close the node clients :func:`node_client` made for ``client``."""
    for found in _node_clients.pop(client, {}).values():
        await found.aclose()
        await found.connection_pool.disconnect()


async def wait(waiters: redis.asyncio.ConnectionPool, keys: Any, job_id: str,
               timeout: float | None, *, shown_timeout: float | None = None) -> Any:
    """The asyncio twin of :func:`echomq.results.wait`, on one connection of ``waiters``
    (``shown_timeout``: the caller's whole timeout, named when it runs out)."""
    validate_job_id(job_id)
    timeout = results.check_timeout(timeout)
    if shown_timeout is None:
        shown_timeout = timeout
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
                raise results.timed_out(job_id, shown_timeout)
            if not await _park(conn, doorbell, remaining) and deadline is not None:
                # one last read, as the sync waiter does
                last = results.outcome(
                    job_id, await _await(conn, scripts.await_keys(keys, job_id), False))
                if last is not results.PENDING:
                    return last
                raise results.timed_out(job_id, shown_timeout)
    except (JobFailed, JobNotFound, TimeoutError):
        raise  # answers read in full: the connection is clean
    except BaseException:  # cancelled or failed: a reply may still come, never reuse
        await conn.disconnect()
        raise
    finally:
        await waiters.release(conn)


async def _send(conn: Any, *command: Any) -> None:
    """Send ``command``, raising a cancel the write swallowed.

    redis-py writes under ``asyncio.wait_for``, which on Python 3.11 returns the write's
    result and drops a cancel that lands as the write completes; the task still counts the
    request, so a waiter that went on would park (up to a slice) with its caller gone."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    await conn.send_command(*command)
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError


async def _await(conn: Any, keys: list[str], mark: bool) -> Any:
    script = scripts.AWAIT
    command = ["EVALSHA", script.sha, script.num_keys, *keys, "1" if mark else "0"]
    await _send(conn, *command)
    try:
        return await conn.read_response()
    except redis.exceptions.NoScriptError:
        await _send(conn, "SCRIPT", "LOAD", script.source)
        await conn.read_response()
        await _send(conn, *command)
        return await conn.read_response()


async def _park(conn: Any, key: str, remaining: float | None) -> bool:
    command, read_timeout = results.block_args(key, remaining)
    await _send(conn, *command)
    reply = await conn.read_response(timeout=read_timeout)
    if reply is None:
        # redis.asyncio answers None both for the server's nil and for our own read
        # deadline, when the call is still parked there: drop it with the socket
        await conn.disconnect()
        return False
    return True
