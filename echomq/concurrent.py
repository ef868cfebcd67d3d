"""The concurrent drain: up to N jobs in flight on an event loop owned by the consumer.

Async handlers run as tasks on the loop, sync handlers in a pool of N threads.
Claims fill the free slots plus a small prefetch buffer and are fused with
settling the outcomes finished since the last round trip. A slot that frees
up starts a buffered job at once, and the next round trip refills the buffer,
so no slot idles for a round trip between two jobs. The buffer holds about as
many jobs as the slots finish in PREFETCH_WAIT_S at the mean run time seen so
far (none before a job has finished, at most half the slots), so jobs that
run long are left for idle consumers. Buffered jobs are held (their leases
extended) but not started: on a stop they are handed back unstarted,
uncharged, and a consumer that dies holding them has them released the same
way. A job buffered for half its lease period or longer is handed back
instead of started: its lease may have run out meanwhile (nothing extended
it: a stopped or cut-off supervisor) and the job been reaped and handed to
another consumer, so starting it would run it twice. Round trips go over an
asyncio client of the loop's own, so the loop never blocks on the server,
and a few may overlap: a job that finishes while one is under way starts the
next at once instead of waiting for it (under load they batch by
themselves). When a claim comes back short the drain is dry: it settles what
finishes but claims again only with a settle, or when poked.

The owner either runs the loop in its own thread (:meth:`serve`, with a file
descriptor to watch, as a forked consumer does with its pipe) or in a thread
of the drain's (:meth:`start`, as the standalone consumer does while it parks
on the doorbell). :meth:`poke` and :meth:`stop` are safe from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from echomq import aio, cancelwatch, loops, scripts
from echomq.asynctwin import async_twin
from echomq.backoff import retry_pause
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.drain import DrainHooks
from echomq.job import Claimed, parse_claimed
from echomq.lanes import Lanes, Outcome, unheld_claims
from echomq.runner import Runner, is_async
from echomq.scripts import Settled

log = logging.getLogger("echomq.drain")
MAX_CLAIM = 1000  # jobs one claim may lease: bounds one script's run time
MAX_RETRY_WAIT_S = 2.0
MAX_SETTLE_ERRORS = 5  # a job's settle failing by a script error this often is given up
MAX_ROUND_TRIPS = 3  # overlapping round trips at most; past that, outcomes batch up
# the buffer holds about as many jobs as the slots finish in this long (so a buffered job
# starts within it), at most default_prefetch(): jobs long enough to keep a slot for a while
# are left for idle consumers instead of waiting here
PREFETCH_WAIT_S = 0.025
RUN_TIME_WEIGHT = 0.1  # of each new job in the mean run time
# a job buffered this share of its lease period (or longer) is handed back, not started: only
# an extension kept its lease, and if none came it may have been reaped and claimed again
STALE_BUFFER_SHARE = 0.5


class ConcurrentDrain:
    """One queue's claim → run → settle loop with up to ``concurrency`` jobs in flight."""

    def __init__(self, lanes: Lanes, runner: Runner, hooks: DrainHooks,
                 concurrency: int, prefetch: int | None = None) -> None:
        self.lanes = lanes
        self.runner = runner
        self.hooks = hooks
        self.concurrency = concurrency
        # the most jobs buffered; how many depends on the jobs' mean run time (none until
        # one has finished)
        self.max_prefetch = default_prefetch(concurrency) if prefetch is None else max(0, prefetch)
        self.mean_run_s: float | None = None
        # claimed, not started (with when their claim came back, loop time): they start in
        # claim order as slots free, unless buffered for STALE_BUFFER_SHARE of a lease
        # period; a job marked to run alone waits until nothing runs and every outcome is
        # settled (a crash must cost no other job anything), and nothing starts beside it
        # (which of several jobs killed a process is not known)
        self.buffer: deque[tuple[Claimed, float]] = deque()
        self.stale_after_s = lanes.settings.lease_ms / 1000 * STALE_BUFFER_SHARE
        self.alone = False  # a job that must run alone is in flight
        # a claim failed on the way back: jobs the server leased may never have reached us;
        # they go back (uncharged) once no round trip is under way
        self.claim_unknown = False
        self.handback: list[tuple[str, str]] = []  # unstarted jobs to release (when stopping)
        # running jobs given up past the owner's drain timeout: released counting a stall
        self.overdue: list[tuple[str, str]] = []
        self.loop = loops.new_event_loop()
        self.threads = ThreadPoolExecutor(concurrency, thread_name_prefix="echomq-job")
        # by (job id, token): a job claimed again after its old lease was reaped may run
        # twice here at once, and each run is its own
        self.in_flight: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.coroutines: set[tuple[str, str]] = set()  # in_flight keys of async handlers
        self.done: list[Outcome] = []  # finished, not settled yet
        self.resent: set[Outcome] = set()  # in done again after a round trip failed
        self.trips: set[asyncio.Task[None]] = set()  # round trips under way
        self.settling = 0  # outcomes in those round trips
        self.claiming = 0  # slots their claims may fill
        self.failures = 0
        self.settle_errors: dict[str, int] = {}  # job id: its settles failed by a script error
        self.isolate = False  # settle each outcome by a call of its own (after a script error)
        self.dry = True  # claim only when poked (or together with a settle)
        self.pokes = 0  # pokes so far: a claim sent before the latest one does not make us dry
        self.chain = False  # the first claim after a poke rings on if work remains
        self.blocked = False  # the server failed: retry after a pause (at once when poked)
        self.stopping = False
        self.abandon = False  # when stopping: give up on outcomes the server cannot take
        self.told_kept = False
        self._quiet_waiters: list[threading.Event] = []
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # --- control (any thread) --------------------------------------------------------

    def check_cancels(self) -> None:
        """A job held here may have been cancelled: cancel the coroutines and drop the
        unstarted jobs whose tokens went stale (any thread; see echomq.cancelwatch)."""
        self._call(lambda: self.loop.create_task(cancelwatch.stale_check(self)))

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
        """Claim no more and hand back the buffered jobs unstarted; finish and settle the
        jobs in flight, then :meth:`serve` returns.
        Outcomes the server cannot take are retried until it answers, or, with ``abandon``,
        given up (their leases expire and the jobs run again)."""
        def on_stop() -> None:
            self.abandon |= abandon
            self._on_stop()

        self._call(on_stop)

    def give_up(self) -> None:
        """Past the owner's drain timeout: stop as :meth:`stop` with ``abandon`` does, and
        hand back the running jobs counting a stall, as the supervisor does with a process
        it ends at its drain deadline. An async job is cancelled; a sync handler's thread
        cannot be stopped, so it runs on unseen and its outcome is dropped."""
        self._call(self._on_give_up)

    def start(self) -> None:
        """Run the loop in a thread of its own."""
        self._thread = threading.Thread(target=self.serve, name="echomq-loop", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the drain to end; True once it has."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def serve(self, fd: int | None = None, on_readable: Callable[[], None] | None = None,
              on_term: Callable[[], None] | None = None) -> None:
        """Run the loop in this thread until stopped and every job is settled. ``on_term``
        (main thread only) is called on the loop at a SIGTERM while it runs; before and
        after, SIGTERM goes to the handler it had."""
        asyncio.set_event_loop(self.loop)
        if fd is not None and on_readable is not None:
            self.loop.add_reader(fd, on_readable)
        previous = signal.getsignal(signal.SIGTERM)
        if on_term is not None:
            self.loop.add_signal_handler(signal.SIGTERM, on_term)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            if fd is not None:
                self.loop.remove_reader(fd)
            if on_term is not None:
                self._hand_back_sigterm(previous)
            self.threads.shutdown(wait=False)
            self.loop.close()
            self._tell_quiet()

    def _hand_back_sigterm(self, previous: Any) -> None:
        """Give SIGTERM back to its handler before the loop closes: asyncio's close shuts
        the loop's self-pipe before it stops the signal wakeup fd writing to it, so a
        SIGTERM in between would be written to a closed descriptor. Held back meanwhile,
        so one arriving goes to ``previous``, not to the default (which ends the process)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self.loop.remove_signal_handler(signal.SIGTERM)  # the wakeup fd goes with the last
            signal.signal(signal.SIGTERM, previous)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

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
        self.pokes += 1
        self.dry = False
        self.chain = True
        self.blocked = False
        self._set_wake()

    def _on_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self._hand_back_buffer()
        self._set_wake()

    def _on_give_up(self) -> None:
        self.abandon = True
        self._on_stop()
        for key, task in self.in_flight.items():
            self.overdue.append(key)
            task.cancel()
        self.in_flight.clear()  # what a given-up job's task returns is dropped (_run_one)
        self.alone = False
        self._set_wake()

    def _hand_back_buffer(self) -> None:
        """Claimed jobs that have not started go back to their lanes, unstarted."""
        while self.buffer:
            claimed, _ = self.buffer.popleft()
            self.handback.append((claimed.id, claimed.token))

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
            await aio.close_node_clients(self.aclient)

    async def _drive(self) -> None:
        while True:
            if self.hooks.stop_requested():
                self._on_stop()
            if self.stopping and not (self.in_flight or self.done or self.trips
                                      or self.handback or self.overdue):
                return
            if self.blocked:
                if self.trips:
                    await self._wait()
                    continue
                if self.stopping and self.abandon and not self.in_flight:
                    log.warning("queue %s: leaving %d unsettled outcome(s) and %d unstarted "
                                "job(s); their leases will expire", self.lanes.keys.queue,
                                len(self.done), len(self.handback))
                    return
                if self.stopping and self.abandon:
                    await self._wait()
                    continue
                if self.stopping and not self.told_kept:
                    self.told_kept = True
                    log.warning("queue %s: stopping with %d unsettled outcome(s) and %d "
                                "unstarted job(s), kept until the server answers",
                                self.lanes.keys.queue, len(self.done), len(self.handback))
                # only this consumer's connection may have failed, and then nobody pokes
                # it: what it holds is settled, handed back or claimed again after a pause
                await self._back_off()
                continue
            if self.claim_unknown and not self.trips:
                self.claim_unknown = False
                try:
                    await self._release_unheld()
                except UNAVAILABLE_ERRORS:
                    self.claim_unknown = True
                    self.blocked = True
                    self.failures += 1
                    continue
            # jobs held or on their way: running, buffered, finished, settling, being claimed
            room = self.concurrency + self.prefetch() - (
                len(self.in_flight) + len(self.buffer) + len(self.done) + self.settling
                + self.claiming + len(self.handback))
            # a settle carries a claim for the free room even when dry: it costs no round trip
            claim = room > 0 and not self.stopping and (not self.dry or bool(self.done))
            if ((not self.done and not claim and not self.handback and not self.overdue)
                    or len(self.trips) >= MAX_ROUND_TRIPS):
                if self.dry and not (self.in_flight or self.buffer or self.done or self.trips
                                     or self.handback):
                    self._tell_quiet()
                await self._wait()
                continue
            outcomes, self.done = self.done, []
            handback, self.handback = self.handback, []
            overdue, self.overdue = self.overdue, []
            want = min(MAX_CLAIM, room + len(outcomes)) if claim else 0
            self.settling += len(outcomes)
            self.claiming += want
            chain, self.chain = self.chain and bool(want), self.chain and not want
            trip = self.loop.create_task(self._round_trip(outcomes, want, chain, handback,
                                                          self.pokes, overdue))
            self.trips.add(trip)

    async def _wait(self, timeout: float | None = None) -> None:
        """Wait for a wake-up (a poke, a stop, a job or a round trip ending), at most
        ``timeout`` seconds."""
        assert self._wake is not None
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return
        self._wake.clear()

    async def _back_off(self) -> None:
        """Blocked by a failed round trip: no event says the server is back, so wait a
        pause that grows with the failures in a row (at most a beat), then try again; a
        poke or a stop ends it early. Jobs finishing meanwhile do not: their outcomes wait
        for it."""
        pause = retry_pause(self.failures,
                            min(MAX_RETRY_WAIT_S, self.lanes.settings.beat_ms / 1000))
        deadline = self.loop.time() + pause
        stopping = self.stopping
        while self.blocked and self.stopping == stopping:
            left = deadline - self.loop.time()
            if left <= 0:
                break
            await self._wait(left)
        self.blocked = False

    async def _round_trip(self, outcomes: list[Outcome], want: int, chain: bool,
                          handback: list[tuple[str, str]], pokes: int = 0,
                          overdue: list[tuple[str, str]] | None = None) -> None:
        """Settle finished jobs, claim ``want`` more, hand back unstarted ones and the
        ``overdue`` ones (given up, counting a stall), in one pipeline (with ``chain``, the
        claim rings the doorbell when work remains, so parked consumers join in).
        ``pokes``: the poke count when it was sent; a short claim makes the drain dry only
        if no poke came since (the work it announced came after this claim ran, and its
        ring is spent)."""
        # after a settle failed by a script error, each outcome is settled by a call of its
        # own, so one job that fails every settle holds none of the others with it
        groups = [[o] for o in outcomes] if self.isolate else [outcomes] if outcomes else []
        calls = [self.lanes.settle_call(group) for group in groups]
        if want:
            calls.append(self.lanes.claim_call(want, chain))
        if handback:
            calls.append(self.lanes.release_call(handback, "unstarted"))
        if overdue:
            calls.append(self.lanes.release_call(overdue, "stall"))
        try:  # each call's error is its own reply: a failed settle loses no claim's reply
            replies = await self._execute(calls, raise_errors=False)
        except Exception as exc:  # noqa: BLE001 - the pipeline failed: every call with it
            replies = [exc] * len(calls)
        finally:
            self.settling -= len(outcomes)
            self.claiming -= want
            self.trips.discard(asyncio.current_task())  # type: ignore[arg-type]
            self._set_wake()
        settle_replies = replies[:len(groups)]
        claim_reply = replies[len(groups)] if want else None
        release_reply = replies[len(calls) - 1 - bool(overdue)] if handback else None
        overdue_reply = replies[-1] if overdue else None
        # settled first: their holdings entries free up before the new batch takes them
        settled: list[Outcome] = []
        codes: list[Settled] = []
        kept: list[Outcome] = []
        dropped: list[Outcome] = []
        script_error = False
        for group, reply in zip(groups, settle_replies, strict=True):
            if not isinstance(reply, Exception):
                settled += group
                codes += scripts.settled_codes(reply)
            elif isinstance(reply, UNAVAILABLE_ERRORS):
                kept += group
            else:
                script_error = True
                (dropped if self._give_up_settling(group, reply) else kept).extend(group)
        for o in (*settled, *dropped):
            self.settle_errors.pop(o.job_id, None)
        self.isolate = script_error or (self.isolate and bool(kept))
        if settled:
            self._settled(settled, codes)
            if not self.stopping:
                self._fill()  # a job waiting to run alone may start now
        if dropped:  # no longer held: their leases run out and the reaper hands them out again
            self.hooks.after_settle(dropped, [Settled.STALE] * len(dropped))
        if kept:
            self.done = kept + self.done  # kept: their jobs stay held, settled later
            self.resent.update(kept)
        if handback and not isinstance(release_reply, Exception):
            self.hooks.on_unstarted(handback)
        elif handback:
            self.handback = handback + self.handback  # kept: still held, released later
        if overdue and isinstance(overdue_reply, Exception):
            self.overdue = overdue + self.overdue
        # a claim that went through is held and run even when the settle beside it failed
        if want and not isinstance(claim_reply, Exception):
            batch = parse_claimed(claim_reply)
            self._take(batch)
            if len(batch) == want:
                self.dry = False  # more may be waiting
            elif not self.dry and self.pokes == pokes:  # poked meanwhile: claim again
                self.dry = True
                self.hooks.on_dry()
        if isinstance(claim_reply, Exception):
            self.claim_unknown = True
        failed = next((r for r in (*settle_replies, claim_reply, release_reply, overdue_reply)
                       if isinstance(r, Exception)), None)
        if failed is None:
            self.failures = 0
            return
        self.failures += 1
        self.blocked = True
        if isinstance(failed, UNAVAILABLE_ERRORS):
            # not dry: the drain goes on where it was once a retry gets through, and says
            # IDLE only then (the supervisor extends what it holds meanwhile)
            if self.failures == 1 or self.failures % 20 == 0:
                log.warning("queue %s: server unreachable while draining (%d outcome(s) "
                            "kept, trying again): %s", self.lanes.keys.queue, len(self.done),
                            failed)
        elif self.failures == 1 or self.failures % 20 == 0:
            # a script error: say so loudly; the outcomes are kept, never dropped
            log.error("queue %s: a settle, claim or release failed (%d outcome(s) kept): %s",
                      self.lanes.keys.queue, len(self.done), failed)

    def _give_up_settling(self, group: Sequence[Outcome], error: Exception) -> bool:
        """True when the one outcome of ``group`` met a script error (no outage)
        MAX_SETTLE_ERRORS times: a job key of the wrong kind fails every settle it is in,
        and kept for ever its outcome would hold a slot of this drain."""
        if len(group) != 1:
            return False  # settled one by one from now on, to find the one that fails
        job_id = group[0].job_id
        errors = self.settle_errors[job_id] = self.settle_errors.get(job_id, 0) + 1
        if errors < MAX_SETTLE_ERRORS:
            return False
        log.error("queue %s: giving up on settling job %s after %d script errors (%s); its "
                  "lease will expire and it runs again", self.lanes.keys.queue, job_id, errors,
                  error)
        return True

    async def _release_unheld(self) -> None:
        """Hand back the jobs our claims leased that we do not hold (Lanes.release_unheld)."""
        if not self.lanes.claimer:
            return
        held = {*self.in_flight, *((c.id, c.token) for c, _ in self.buffer),
                *((o.job_id, o.token) for o in self.done), *self.handback, *self.overdue}
        raw = await self.aclient.lrange(self.lanes.keys.claims(self.lanes.claimer), 0, -1)
        unheld = unheld_claims(raw, held)
        if unheld:
            await self._execute([self.lanes.release_call(unheld, "unstarted")])

    async def _execute(self, calls: Sequence[tuple[scripts.LuaScript, list[str], list[Any]]],
                       *, raise_errors: bool = True) -> list[Any]:
        """Run script calls in one pipeline, loading a script the server lacks (NOSCRIPT);
        on a cluster, on the node owning the queue's slot (see :func:`echomq.aio.execute`)."""
        return await aio.execute(self.aclient, calls, raise_errors=raise_errors)

    def _settled(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        for o, code in zip(outcomes, codes, strict=True):
            resent = o in self.resent
            self.resent.discard(o)
            if code is Settled.STALE and resent:
                # a settled job's token matches nothing: the two cannot be told apart
                log.warning("queue %s: job %s: its outcome, sent again after a lost reply, "
                            "was refused: either the first sending recorded it, or its lease "
                            "expired and it was handed out again", self.lanes.keys.queue,
                            o.job_id)
            elif code is Settled.STALE:
                log.warning("queue %s: job %s settled with a stale lease token (its lease "
                            "expired and it was handed out again, or it was cancelled while "
                            "running); result not recorded",
                            self.lanes.keys.queue, o.job_id)
        self.hooks.after_settle(outcomes, codes)

    def prefetch(self) -> int:
        """How many jobs to hold beyond the running ones: as many as the slots finish in
        about PREFETCH_WAIT_S at the mean run time so far, at most ``max_prefetch``."""
        if self.mean_run_s is None:
            return 0
        if self.mean_run_s * self.max_prefetch <= self.concurrency * PREFETCH_WAIT_S:
            return self.max_prefetch
        return int(self.concurrency * PREFETCH_WAIT_S / self.mean_run_s)

    def _take(self, batch: Sequence[Claimed]) -> None:
        """A claimed batch is held: start what free slots allow, buffer the rest."""
        if not batch:
            return
        self.hooks.on_batch(batch)
        now = self.loop.time()
        self.buffer.extend((claimed, now) for claimed in batch)
        if self.stopping:
            self._hand_back_buffer()
        else:
            self._fill()

    def _fill(self) -> None:
        """Start buffered jobs in the free slots, in claim order, keeping a job marked
        ``alone`` alone; hand back those buffered so long that their leases may have run
        out (the next round trip releases them, which a job reaped meanwhile refuses)."""
        stale_before = self.loop.time() - self.stale_after_s
        while self.buffer and len(self.in_flight) < self.concurrency and not self.alone:
            if self.hooks.stop_requested():
                self._on_stop()
                return
            claimed, taken_at = self.buffer[0]
            if taken_at <= stale_before:
                self.buffer.popleft()
                self.handback.append((claimed.id, claimed.token))
                self._set_wake()
                continue
            if claimed.alone and (self.in_flight or self.done or self.settling):
                return  # it starts when the jobs before it are done and settled
            self.buffer.popleft()
            self._start(claimed)

    def _start(self, claimed: Claimed) -> None:
        try:
            prepared = self.runner.prepare(claimed)
        except Exception as exc:  # noqa: BLE001 - the job's failure, never the drain's
            prepared = self.runner.failed(claimed, exc, None)
        if isinstance(prepared, Outcome):
            self.hooks.on_start(claimed)
            self.hooks.on_finish(claimed)
            self.done.append(prepared)
            return
        job, fn = prepared
        in_thread = not is_async(fn)
        self.hooks.on_start(claimed, in_thread=in_thread)
        task = self.loop.create_task(self._run_one(claimed, job, fn))
        self.in_flight[claimed.id, claimed.token] = task
        if not in_thread:
            self.coroutines.add((claimed.id, claimed.token))
        self.alone = claimed.alone

    async def _run_one(self, claimed: Claimed, job: Any, fn: Callable[..., Any]) -> None:
        started = self.loop.time()
        try:
            outcome = await self.runner.run_async(claimed, job, fn, self.threads)
        except Exception as exc:  # noqa: BLE001 - run_async turns a handler's into an outcome:
            # this is one of its own, and still the job's failure, so the job is settled
            outcome = self.runner.failed(claimed, exc, None)
        finally:
            given_up = self.in_flight.pop((claimed.id, claimed.token), None) is None
            self.coroutines.discard((claimed.id, claimed.token))
            if claimed.alone and not given_up:
                self.alone = False
        if given_up:  # handed back counting a stall (give_up): its outcome is not ours
            return
        ran = self.loop.time() - started
        mean = self.mean_run_s
        self.mean_run_s = ran if mean is None else mean + RUN_TIME_WEIGHT * (ran - mean)
        self.hooks.on_finish(claimed)
        self.done.append(outcome)
        if not self.stopping:
            self._fill()  # a buffered job takes the slot now, not a round trip later
        self._set_wake()


def default_prefetch(concurrency: int) -> int:
    """The most jobs claimed beyond ``concurrency``, ready for the next free slot: half as
    many as the slots (at least one)."""
    return max(1, concurrency // 2)


def max_held(concurrency: int, claim_batch: int = 1) -> int:
    """The most jobs one consumer may hold at once, for sizing a table of them: running,
    buffered and finished ones, plus a claim that went through beside a failed settle."""
    return 2 * max(claim_batch, concurrency + default_prefetch(concurrency))
