"""The concurrent drain: up to N jobs in flight on an event loop owned by the consumer.

Async handlers run as tasks on the loop, sync handlers in a pool of N threads.
Claims fill the free slots and are fused with settling the outcomes finished
since the last round trip, so a slot that frees up claims again without
waiting for the rest. Round trips go over an asyncio client of the loop's own,
so the loop never blocks on the server, and a few may overlap: a job that
finishes while one is under way starts the next at once instead of waiting
for it (under load they batch by themselves). When a claim comes back short
the drain is dry: it settles what finishes but claims again only with a
settle, or when poked.

The owner either runs the loop in its own thread (:meth:`serve`, with a file
descriptor to watch, as a forked consumer does with its pipe) or in a thread
of the drain's (:meth:`start`, as the standalone consumer does while it parks
on the doorbell). :meth:`poke` and :meth:`stop` are safe from any thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

from echomq import scripts
from echomq.connection import UNAVAILABLE_ERRORS, AsyncRefusalParser
from echomq.drain import DrainHooks
from echomq.job import Claimed, parse_claimed
from echomq.lanes import Lanes, Outcome, unheld_claims
from echomq.runner import Runner, is_async
from echomq.scripts import Settled

log = logging.getLogger("echomq.drain")
MAX_CLAIM = 1000  # jobs one claim may lease: bounds one script's run time
MAX_RETRY_WAIT_S = 2.0
MAX_ROUND_TRIPS = 3  # overlapping round trips at most; past that, outcomes batch up


class ConcurrentDrain:
    """One queue's claim → run → settle loop with up to ``concurrency`` jobs in flight."""

    def __init__(self, lanes: Lanes, runner: Runner, hooks: DrainHooks,
                 concurrency: int) -> None:
        self.lanes = lanes
        self.runner = runner
        self.hooks = hooks
        self.concurrency = concurrency
        self.loop = asyncio.new_event_loop()
        self.threads = ThreadPoolExecutor(concurrency, thread_name_prefix="echomq-job")
        self.in_flight: dict[str, asyncio.Task[None]] = {}
        # held, waiting to start: a job marked to run alone waits until nothing runs and
        # every outcome is settled (a crash must cost no other job anything), and nothing
        # starts beside it (which of several jobs killed a process is not known)
        self.waiting: list[Claimed] = []
        self.alone = False  # a job that must run alone is in flight
        # a claim failed on the way back: jobs the server leased may never have reached us;
        # they go back (uncharged) once no round trip is under way
        self.claim_unknown = False
        self.done: list[Outcome] = []  # finished, not settled yet
        self.trips: set[asyncio.Task[None]] = set()  # round trips under way
        self.settling = 0  # outcomes in those round trips
        self.claiming = 0  # slots their claims may fill
        self.failures = 0
        self.dry = True  # claim only when poked (or together with a settle)
        self.chain = False  # the first claim after a poke rings on if work remains
        self.blocked = False  # the server failed: wait for a poke (or retry, when stopping)
        self.stopping = False
        self.abandon = False  # when stopping: give up on outcomes the server cannot take
        self.told_kept = False
        self._quiet_waiters: list[threading.Event] = []
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # --- control (any thread) --------------------------------------------------------

    def poke(self) -> None:
        """Work may be waiting: claim into the free slots."""
        self._call(self._on_poke)

    def poke_and_wait(self) -> None:
        """Poke, then block until a claim came back short and every job is settled."""
        quiet = threading.Event()

        def poke() -> None:
            self._quiet_waiters.append(quiet)
            self._on_poke()

        self._call(poke)
        quiet.wait()

    def stop(self, *, abandon: bool = False) -> None:
        """Claim no more; finish and settle the jobs in flight, then :meth:`serve` returns.
        Outcomes the server cannot take are retried until it answers, or, with ``abandon``,
        given up (their leases expire and the jobs run again)."""
        def on_stop() -> None:
            self.abandon |= abandon
            self._on_stop()

        self._call(on_stop)

    def start(self) -> None:
        """Run the loop in a thread of its own."""
        self._thread = threading.Thread(target=self.serve, name="echomq-loop", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def serve(self, fd: int | None = None, on_readable: Callable[[], None] | None = None
              ) -> None:
        """Run the loop in this thread until stopped and every job is settled."""
        asyncio.set_event_loop(self.loop)
        if fd is not None and on_readable is not None:
            self.loop.add_reader(fd, on_readable)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            if fd is not None:
                self.loop.remove_reader(fd)
            self.threads.shutdown(wait=False)
            self.loop.close()
            self._tell_quiet()

    def _call(self, fn: Callable[[], None]) -> None:
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: nothing left to do
            self._tell_quiet()

    def _tell_quiet(self) -> None:
        waiters, self._quiet_waiters = self._quiet_waiters, []
        for quiet in waiters:
            quiet.set()

    def _on_poke(self) -> None:
        self.dry = False
        self.chain = True
        self.blocked = False
        self._set_wake()

    def _on_stop(self) -> None:
        self.stopping = True
        self._set_wake()

    def _set_wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # --- the loop ----------------------------------------------------------------------

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        self.aclient = async_twin(self.lanes.client)
        try:
            await self._drive()
        finally:
            await self.aclient.aclose()

    async def _drive(self) -> None:
        while True:
            if self.hooks.stop_requested():
                self.stopping = True
            if self.stopping and not (self.in_flight or self.waiting or self.done
                                      or self.trips):
                return
            if self.blocked:
                if self.trips:
                    await self._wait()
                    continue
                if not self.stopping:
                    await self._wait()
                    continue
                if self.abandon and not (self.in_flight or self.waiting):
                    log.warning("queue %s: leaving %d unsettled outcome(s); their leases will "
                                "expire", self.lanes.keys.queue, len(self.done))
                    return
                if self.abandon:
                    await self._wait()
                    continue
                if not self.told_kept:
                    self.told_kept = True
                    log.warning("queue %s: stopping with %d unsettled outcome(s), kept until "
                                "the server answers", self.lanes.keys.queue, len(self.done))
                # no event says the server is back: retry the settle after a pause
                await asyncio.sleep(min(MAX_RETRY_WAIT_S, 0.05 * 2 ** min(self.failures, 6)))
                self.blocked = False
            if self.claim_unknown and not self.trips:
                self.claim_unknown = False
                try:
                    await self._release_unheld()
                except UNAVAILABLE_ERRORS:
                    self.claim_unknown = True
                    self.blocked = True
                    self.failures += 1
                    continue
            free = self.concurrency - (len(self.in_flight) + len(self.waiting) + len(self.done)
                                       + self.settling + self.claiming)
            # a settle carries a claim for the free slots even when dry: it costs no round trip
            claim = free > 0 and not self.stopping and (not self.dry or bool(self.done))
            if (not self.done and not claim) or len(self.trips) >= MAX_ROUND_TRIPS:
                if self.dry and not (self.in_flight or self.waiting or self.done or self.trips):
                    self._tell_quiet()
                await self._wait()
                continue
            outcomes, self.done = self.done, []
            want = min(MAX_CLAIM, free + len(outcomes)) if claim else 0
            self.settling += len(outcomes)
            self.claiming += want
            chain, self.chain = self.chain and bool(want), self.chain and not want
            trip = self.loop.create_task(self._round_trip(outcomes, want, chain))
            self.trips.add(trip)

    async def _wait(self) -> None:
        assert self._wake is not None
        await self._wake.wait()
        self._wake.clear()

    async def _round_trip(self, outcomes: list[Outcome], want: int, chain: bool) -> None:
        """Settle finished jobs and claim ``want`` more, in one pipeline (with ``chain``,
        the claim rings the doorbell when work remains, so parked consumers join in)."""
        calls = []
        if outcomes:
            calls.append(self.lanes.settle_call(outcomes))
        if want:
            calls.append(self.lanes.claim_call(want, chain))
        try:
            replies = await self._execute(calls)
        except UNAVAILABLE_ERRORS as exc:
            replies = [exc] * len(calls)
        finally:
            self.settling -= len(outcomes)
            self.claiming -= want
            self.trips.discard(asyncio.current_task())  # type: ignore[arg-type]
            self._set_wake()
        settle_reply = replies[0] if outcomes else None
        claim_reply = replies[-1] if want else None
        # settled first: their holdings entries free up before the new batch takes them
        if outcomes and not isinstance(settle_reply, Exception):
            self._settled(outcomes, [Settled(int(c)) for c in settle_reply])
            self._start_waiting()
        elif outcomes:
            self.done = outcomes + self.done  # kept: their jobs stay held, settled later
        # a claim that went through is held and run even when the settle beside it failed
        if want and not isinstance(claim_reply, Exception):
            batch = parse_claimed(claim_reply)
            self._start(batch)
            if len(batch) == want:
                self.dry = False  # more may be waiting
            elif not self.dry:
                self.dry = True
                self.hooks.on_dry()
        if isinstance(claim_reply, Exception):
            self.claim_unknown = True
        failed = next((r for r in (settle_reply, claim_reply) if isinstance(r, Exception)), None)
        if failed is None:
            self.failures = 0
            return
        self.failures += 1
        self.blocked = True
        if isinstance(failed, UNAVAILABLE_ERRORS):
            if self.failures == 1 or self.failures % 20 == 0:
                log.warning("queue %s: server unreachable while draining (%d outcome(s) "
                            "kept): %s", self.lanes.keys.queue, len(self.done), failed)
            if not self.dry:
                self.dry = True
                self.hooks.on_dry()
        else:  # a script error: say so loudly; the outcomes are kept, never dropped
            log.error("queue %s: a settle or claim failed (%d outcome(s) kept): %s",
                      self.lanes.keys.queue, len(self.done), failed)

    async def _release_unheld(self) -> None:
        """Hand back the jobs our claims leased that we do not hold (Lanes.release_unheld)."""
        if not self.lanes.claimer:
            return
        held = {*self.in_flight, *(c.id for c in self.waiting), *(o.job_id for o in self.done)}
        raw = await self.aclient.lrange(self.lanes.keys.claims(self.lanes.claimer), 0, -1)
        unheld = unheld_claims(raw, held)
        if unheld:
            await self._execute([scripts.release_call(self.lanes.keys, unheld, "unstarted")])

    async def _execute(self, calls: Sequence[tuple[scripts.LuaScript, list[str], list[Any]]]
                       ) -> list[Any]:
        """Run script calls in one pipeline, loading a script the server lacks (NOSCRIPT)."""
        pipe = self.aclient.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, script.num_keys, *keys, *args)
        replies = list(await pipe.execute(raise_on_error=False))
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError):
                script, keys, args = calls[i]
                await self.aclient.script_load(script.source)
                replies[i] = await self.aclient.evalsha(script.sha, script.num_keys, *keys,
                                                        *args)
            elif isinstance(reply, Exception):
                raise reply
        return replies

    def _settled(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        for o, code in zip(outcomes, codes, strict=True):
            if code is Settled.STALE:
                log.warning("queue %s: job %s settled with a stale lease token (its lease "
                            "expired and it was handed out again); result not recorded",
                            self.lanes.keys.queue, o.job_id)
        self.hooks.after_settle(outcomes, codes)

    def _start(self, batch: Sequence[Claimed]) -> None:
        if not batch:
            return
        self.hooks.on_batch(batch)
        self.waiting.extend(batch)
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start held jobs in claim order, keeping a job marked ``alone`` alone."""
        while self.waiting and not self.alone:
            claimed = self.waiting[0]
            if claimed.alone and (self.in_flight or self.done or self.settling):
                return  # it starts when the jobs before it are done and settled
            self.waiting.pop(0)
            prepared = self.runner.prepare(claimed)
            if isinstance(prepared, Outcome):
                self.hooks.on_start(claimed)
                self.hooks.on_finish(claimed)
                self.done.append(prepared)
                continue
            job, fn = prepared
            self.hooks.on_start(claimed, in_thread=not is_async(fn))
            task = self.loop.create_task(self._run_one(claimed, job, fn))
            self.in_flight[claimed.id] = task
            self.alone = claimed.alone

    async def _run_one(self, claimed: Claimed, job: Any, fn: Callable[..., Any]) -> None:
        try:
            outcome = await self.runner.run_async(claimed, job, fn, self.threads)
        finally:
            self.in_flight.pop(claimed.id, None)
            if claimed.alone:
                self.alone = False
        self.hooks.on_finish(claimed)
        self.done.append(outcome)
        self._start_waiting()
        self._set_wake()


def async_twin(client: redis.Redis) -> redis.asyncio.Redis:
    """An asyncio client for the server (and options) a sync client talks to."""
    pool: Any = client.connection_pool
    sync_cls = pool.connection_class
    if issubclass(sync_cls, redis.connection.UnixDomainSocketConnection):
        cls: Any = redis.asyncio.UnixDomainSocketConnection
    elif issubclass(sync_cls, redis.connection.SSLConnection):
        cls = redis.asyncio.SSLConnection
    else:
        cls = redis.asyncio.Connection
    accepted: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            accepted |= set(inspect.signature(init).parameters)
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in accepted}
    if "parser_class" in kwargs:  # a sync parser cannot read for an asyncio connection
        kwargs["parser_class"] = AsyncRefusalParser
    return redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool(
        connection_class=cls, **kwargs))
