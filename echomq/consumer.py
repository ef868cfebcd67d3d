"""The standalone consumer loop: reap → promote → drain → park.

Parking is an outstanding ``BLPOP emq:{q}:wake <beat>`` (or ``BZPOPMIN
emq:{q}:marker <beat>`` with the marker doorbell) on a dedicated connection
(see :mod:`echomq.wake`), waited on with a local timer set to the schedule
head's due time, because the server's timeout only fires on its ``hz`` tick.
Leases of the jobs in hand are extended by a heartbeat thread, so long jobs
are not reaped while the consumer lives.

With ``concurrency`` > 1 or an ``async def`` handler, jobs run on an event loop
of the consumer's own (:mod:`echomq.concurrent`) while this loop parks. A job's
time limit cancels an async handler; a sync handler cannot be interrupted in
its thread, so only the supervisor (which ends the process) enforces it there.

No supervisor watches this consumer, so nothing knows which of its jobs was
running when its process dies: every job it held comes back by lease expiry,
charged a stall. So with a sync handler and ``concurrency`` 1 it holds one job
at a time (the settle of each is fused with the claim of the next), and a job
that kills the process is the only one charged.

A stop (:meth:`Consumer.stop`, or SIGINT or SIGTERM while :meth:`Consumer.run`
runs in the main thread) claims no more, hands back unstarted the jobs claimed
but not started, and lets the running ones finish and settle within
``drain_timeout`` seconds. Past it (or at a second signal) the jobs still
running go back counting a stall, as the supervisor's drain timeout does: an
async job is cancelled, a sync job in the main thread is interrupted with
KeyboardInterrupt, and a sync job in a thread of the pool, which cannot be
stopped, runs on with its outcome dropped (the process exits once it returns).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.exceptions

from echomq import logcontext, loops, protocol, scripts
from echomq.backoff import retry_pause
from echomq.concurrent import ConcurrentDrain
from echomq.config import DEFAULT_DRAIN_TIMEOUT_S, QueueSettings
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.drain import Drain
from echomq.errors import ConfigError
from echomq.job import Claimed
from echomq.lanes import Lanes, Outcome, record_lane_limit
from echomq.queue import Queue
from echomq.reapgrace import ReapGrace
from echomq.runner import HandlerLike, Runner
from echomq.scripts import Settled
from echomq.stoplistener import StopListener
from echomq.wake import Doorbell, claim_doorbell

log = logging.getLogger("echomq.consumer")
MAX_RECONNECT_WAIT_S = 5.0
GIVE_UP_WAIT_S = 5.0  # past the drain timeout: how long the given-up pool may take to end
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Consumer:
    """Runs ``handler(job)`` for the jobs of one queue until :meth:`stop` (or SIGINT or
    SIGTERM while :meth:`run` has the main thread). ``drain_timeout``: how long a stop
    lets running jobs finish before they go back counting a stall (default 25 s).
    ``middleware``: :class:`echomq.Middleware` instances around each job (default: those
    of the Queue given, if any)."""

    def __init__(
        self,
        queue: str | Queue,
        handler: HandlerLike,
        *,
        redis_url: str | None = None,
        redis: redis.Redis | None = None,
        beat_ms: int | None = None,
        lease_ms: int | None = None,
        concurrency: int | None = None,
        job_timeout: float | None = None,
        drain_timeout: float | None = None,
        settings: QueueSettings | None = None,
        middleware: Sequence[Any] | None = None,
        **overrides: Any,
    ) -> None:
        self.drain_timeout = DEFAULT_DRAIN_TIMEOUT_S if drain_timeout is None else \
            float(drain_timeout)
        if not self.drain_timeout >= 0:
            raise ConfigError(f"drain_timeout must be >= 0, got {drain_timeout}")
        if concurrency is not None:
            overrides["concurrency"] = concurrency
        loops.loop_kind()  # a bad ECHOMQ_EVENT_LOOP fails here, before any job is claimed
        if job_timeout is not None:
            overrides["job_timeout"] = job_timeout
        if beat_ms is not None:
            overrides["beat_ms"] = beat_ms
        if lease_ms is not None:
            overrides["lease_ms"] = lease_ms
        if isinstance(queue, Queue):
            base = settings or queue.settings
            self.queue = Queue(queue.name, redis=queue.redis,
                               settings=base.with_overrides(**overrides))
        else:
            self.queue = Queue(queue, redis_url, redis=redis, settings=settings, **overrides)
        self.settings = self.queue.settings
        self.lanes = Lanes(self.queue.redis, self.queue.keys, self.settings)
        if middleware is None:  # a Queue given with middleware lends it
            middleware = queue.middleware if isinstance(queue, Queue) else ()
        self.runner = Runner(self.queue.name, handler, self.settings,
                             progress=self.lanes.progress, middleware=middleware)
        self.processed = 0
        self._stopping = False
        self._stop_r, self._stop_w = os.pipe()
        os.set_blocking(self._stop_r, False)
        os.set_blocking(self._stop_w, False)
        self._held: dict[str, str] = {}
        self._running: set[tuple[str, str]] = set()  # (id, token) of the jobs running now
        self._held_lock = threading.Lock()
        self._grace = ReapGrace(self.settings.lease_ms / 1000)  # fed by the heartbeat too
        self._stop_deadline: float | None = None  # monotonic; set by the first stop
        self._signalled = False  # a stop signal came while run() had its handlers in place
        self._cut = False  # past the drain timeout, or stopped at once: give up running jobs
        self._main_ident: int | None = None
        self._stop_signal = int(signal.SIGINT)
        self._deadline_timer: threading.Timer | None = None
        self._drainer = Drain(self.lanes, self.runner, self)
        # no claim sent ahead: a standalone consumer keeps no claims record and has no
        # parent, so jobs claimed ahead that it never held would only come back by lease
        # expiry if it died, charged a stall they did not earn
        self._drainer.send_ahead = False
        self._concurrent = self.settings.concurrency > 1 or self.runner.has_async()
        self._pool: ConcurrentDrain | None = None  # a fresh one per run() when concurrent

    # --- control ---------------------------------------------------------------

    def stop(self) -> None:
        """Claim no more and end the loop once the running jobs are settled (within
        ``drain_timeout`` when concurrent); safe from a signal handler or another thread."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.drain_timeout
        self._stopping = True
        if self._pool is not None:
            self._pool.stop()  # past the drain timeout, _finish_pool gives up on it
        try:
            os.write(self._stop_w, b"x")
        except (BlockingIOError, OSError):
            pass  # a byte is already waiting, or the loop has closed the pipe

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for (the loop finishes its batch, then returns)."""
        return self._stopping

    # --- the loop --------------------------------------------------------------

    def run(self, *, burst: bool = False) -> int:
        """Consume until stopped (with ``burst``: until nothing is claimable). Returns jobs run.

        In the main thread, SIGINT and SIGTERM stop it (see :meth:`stop`) unless the
        application set handlers of its own; run() then returns once the running jobs are
        settled or, past ``drain_timeout``, handed back."""
        keys = self.queue.keys
        doorbell = Doorbell(self.queue.redis, keys, self.settings.beat_ms / 1000,
                            self.settings.doorbell)
        self._server_offset_ms: float | None = None  # server clock minus monotonic, in ms
        self._schedule_head_ms: float | None = None
        claimed_bell = False
        beat_s = self.settings.beat_ms / 1000
        lease_s = self.settings.lease_ms / 1000
        grace = self._grace
        heartbeat = threading.Thread(target=self._heartbeat, name="echomq-heartbeat", daemon=True)
        heartbeat_stop = threading.Event()
        self._heartbeat_stop = heartbeat_stop
        heartbeat.start()
        if self._concurrent:
            self._pool = ConcurrentDrain(self.lanes, self.runner, self, self.settings.concurrency)
            self._pool.start()
            listener = StopListener(self.queue.redis, keys, self._on_cancel, beat_s,
                                    self._check_cancels).start()
        next_promote = next_reap = 0.0  # monotonic deadlines; 0 = now
        failures = 0
        work = True  # drain on the first pass, then only when a ring or the pump found work
        logcontext.install()  # the running job's id, queue, lane, attempt on log records
        taken = self._take_signals()
        try:
            while not self._stopping:
                try:
                    if failures:
                        scripts.load_all(self.queue.redis, keys.prefix)
                        grace.answered(time.monotonic())
                    if not claimed_bell:  # refuses (DoorbellMismatch) a queue of the other kind
                        protocol.claim(self.queue.redis, keys)  # and one of another major
                        claim_doorbell(self.queue.redis, keys, doorbell.kind)
                        if self.queue.settings.lane_limit is not None:
                            record_lane_limit(self.queue.redis, keys,
                                              self.queue.settings.lane_limit)
                        claimed_bell = True
                    # leases that ran out in an outage belong to running jobs: no reap
                    # before their holders had a lease period to extend them (reapgrace.py)
                    next_reap = grace.hold(next_reap)
                    now = time.monotonic()
                    if now >= next_reap:
                        next_reap, requeued = self._reap(lease_s)
                        work |= requeued
                    if now >= next_promote:
                        next_promote, promoted = self._promote(beat_s)
                        doorbell.next_due_ms = self._schedule_head_ms  # put back on close
                        work |= promoted
                    if (work or burst) and self._pool is not None:
                        if burst:
                            self._pool.poke_and_wait()
                        else:
                            self._pool.poke()
                        work = False
                    elif work or burst:
                        self._drainer.run()
                        work = False
                    # a claim that stopped after 1,000 lanes at their limit came back empty
                    # with lanes still on the rings: a burst goes on until they are empty
                    if self._stopping or burst and not self.lanes.rings_hold_lanes():
                        break
                    now = time.monotonic()
                    timeout = min(next_promote - now, next_reap - now)
                    rung, woke = doorbell.wait(timeout, self._stop_r)
                    failures = 0
                    if woke:
                        self._drain_stop_pipe()
                    replied = not doorbell.armed  # a ring, a marker or the beat's timeout
                    due = doorbell.take_due()
                    if due is not None:  # a marker's score: the schedule head, no read needed
                        next_promote = min(next_promote, self._local_time(due))
                    elif replied and (doorbell.kind == "list" or not rung):
                        # a list token may mean a new schedule head (a marker would carry its
                        # due time instead); a timed-out beat runs the pump
                        next_promote = 0.0
                    work |= rung
                except UNAVAILABLE_ERRORS as exc:
                    failures += 1
                    grace.failed(time.monotonic())
                    doorbell.reset()
                    wait = retry_pause(failures, MAX_RECONNECT_WAIT_S, doublings=7)
                    log.warning("queue %s: server unreachable (%s); retrying in %.2fs",
                                self.queue.name, exc, wait)
                    # wait on the stop pipe: stop() ends the wait at once
                    select.select([self._stop_r], [], [], wait)
                    next_promote = 0.0
                    work = True
            if self._pool is None and self._drainer.pending:
                self._settle_pending()
        except KeyboardInterrupt:
            # a sync job in this thread was cut off (past the drain timeout, a second signal,
            # or an interrupt of the application's); the pool hands back its own
            if self._pool is None:
                self._hand_back()
            else:
                self._cut = True
            if not self._signalled:
                raise
        finally:
            if self._pool is not None:
                listener.close()
                self._pool.stop()
                self._finish_pool(self._pool)
            heartbeat_stop.set()
            doorbell.close()
            heartbeat.join(timeout=5)
            self._give_back_signals(taken)
            self._running.clear()
        return self.processed

    def _on_cancel(self, job_id: str) -> None:
        """A job was cancelled while running: if this consumer holds it, the pool cancels
        its coroutine (a sync handler stops at its next ``job.progress()``)."""
        with self._held_lock:
            mine = job_id in self._held
        if mine and self._pool is not None:
            self._pool.check_cancels()

    def _check_cancels(self) -> None:
        """The stop subscription is (again) in place: check every held job, for a cancel
        published while it was down."""
        if self._pool is not None:
            self._pool.check_cancels()

    def _reap(self, lease_s: float) -> tuple[float, bool]:
        """Reap expired leases: (next reap deadline, whether jobs were requeued)."""
        requeued, _, next_expiry, server_now = scripts.reap(self.queue.redis, self.queue.keys)
        # without a lease in sight, look again after one lease period: leases taken by
        # other consumers since this reap cannot expire before then
        wait = lease_s if next_expiry < 0 else min(lease_s, (next_expiry - server_now) / 1000)
        return time.monotonic() + max(0.0, wait), requeued > 0

    def _promote(self, beat_s: float) -> tuple[float, bool]:
        """Promote due jobs: (next promote deadline, whether any were promoted)."""
        batch = self.settings.pump_batch
        total = 0
        while True:
            promoted, next_due, server_now = scripts.promote(self.queue.redis, self.queue.keys,
                                                             batch)
            total += promoted
            if promoted < batch:
                break
        # with nothing scheduled, the BLPOP's own timeout ends the park and marks the beat;
        # the local timer is only for a schedule head due before that
        wait = beat_s + 1.0 if next_due < 0 else (next_due - server_now) / 1000
        # the server read its clock somewhere in the round trip: taken as read at its end,
        # a timer aimed by this offset is never early (at most half a round trip late); a
        # timer fired early finds the head not due and costs a second promote
        self._server_offset_ms = server_now - time.monotonic() * 1000
        self._schedule_head_ms = next_due if next_due >= 0 else None
        return time.monotonic() + max(0.0, wait), total > 0

    def _local_time(self, due_ms: float) -> float:
        """A server-clock due time on the monotonic clock (now, when no offset is known)."""
        if self._server_offset_ms is None:
            return 0.0
        return (due_ms - self._server_offset_ms) / 1000

    # --- drain hooks ---------------------------------------------------------------

    def stop_requested(self) -> bool:
        """Drain hook: True once a stop was asked for."""
        return self._stopping

    def batch_size(self) -> int:
        """Drain hook: how many jobs the next claim may take: one. No supervisor knows which
        job was running when this process dies, so every job held then is charged a stall;
        holding one, only the job that killed it is."""
        return 1

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        """Drain hook: the claimed batch is held (its leases are kept alive)."""
        self._hold(batch)

    def on_start(self, claimed: Claimed, in_thread: bool = True) -> None:
        """Drain hook: a job's handler is about to run."""
        self.processed += 1
        self._running.add((claimed.id, claimed.token))

    def on_finish(self, claimed: Claimed) -> None:
        """Drain hook: the job stays held (and extended) until its outcome is settled."""
        self._running.discard((claimed.id, claimed.token))

    def on_unstarted(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Drain hook: these (job id, token) pairs went back unstarted; stop holding them."""
        self._unhold(pairs)

    def after_settle(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        """Drain hook: these outcomes are settled; stop holding their leases."""
        self._unhold([(o.job_id, o.token) for o in outcomes])

    def on_dry(self) -> None:
        """Nothing to do: this loop's doorbell pokes the drain when work arrives."""

    # --- leases in hand ------------------------------------------------------------

    def _hold(self, batch: Sequence[Claimed]) -> None:
        with self._held_lock:
            for c in batch:
                self._held[c.id] = c.token

    def _unhold(self, pairs: Sequence[tuple[str, str]]) -> None:
        with self._held_lock:
            for job_id, token in pairs:
                # held again under a newer token (the old lease was reaped): keep that one
                if self._held.get(job_id) == token:
                    del self._held[job_id]

    def _hand_back(self) -> None:
        """Hand back every job held: one cut off mid-run counting a stall, the rest (never
        started, or finished with the outcome unsettled) uncharged, in claim order."""
        with self._held_lock:
            held = list(self._held.items())
            self._held.clear()
            running, self._running = self._running, set()  # nothing for a signal to cut now
        rest = [pair for pair in held if pair not in running]
        cut = [pair for pair in held if pair in running]
        try:
            if rest:
                self.lanes.release(rest, "unstarted")
            if cut:  # released last, so it goes back in front of the ones claimed after it
                self.lanes.release(cut, "stall")
        except UNAVAILABLE_ERRORS:
            log.warning("queue %s: could not hand back %d jobs; their leases will expire",
                        self.queue.name, len(held))

    # --- stopping ------------------------------------------------------------------

    def _take_signals(self) -> dict[int, Any]:
        """In the main thread, make SIGINT and SIGTERM stop this consumer, unless the
        application set handlers of its own; returns the handlers replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        self._main_ident = threading.get_ident()
        taken: dict[int, Any] = {}
        for sig in STOP_SIGNALS:
            previous = signal.getsignal(sig)
            if previous is signal.default_int_handler or previous == signal.SIG_DFL:
                taken[sig] = previous
                signal.signal(sig, self._on_signal)
        return taken

    def _give_back_signals(self, taken: dict[int, Any]) -> None:
        timer, self._deadline_timer = self._deadline_timer, None
        if timer is not None:
            timer.cancel()
            timer.join()  # a signal it sent is handled here, by _on_signal
        for sig, previous in taken.items():
            signal.signal(sig, previous)

    def _on_signal(self, signum: int, frame: Any) -> None:
        """SIGINT or SIGTERM: the first stops (the running jobs may finish within the drain
        timeout); another, or the drain timeout passing, cuts the running jobs off."""
        if not self._signalled:
            self._signalled = True
            self._stop_signal = signum
            log.warning("queue %s: %s: stopping; %d running job(s) may finish within %.3g s "
                        "(send it again to stop at once)", self.queue.name,
                        signal.Signals(signum).name, len(self._running), self.drain_timeout)
            self.stop()
            if self._pool is None:  # the pool's bound is kept by _finish_pool
                self._deadline_timer = threading.Timer(self.drain_timeout, self._past_deadline)
                self._deadline_timer.daemon = True
                self._deadline_timer.start()
            return
        self._cut = True
        try:
            os.write(self._stop_w, b"x")  # ends a wait to settle again (_settle_pending)
        except (BlockingIOError, OSError):
            pass
        self.runner.cut = True  # a sync job cut before its handler starts is cut there
        log.warning("queue %s: %s again: handing back the running job(s) at once",
                    self.queue.name, signal.Signals(signum).name)
        if self._pool is not None:
            self._pool.give_up()  # its end ends the wait in _finish_pool
        elif self._running and self.runner.in_handler:
            raise KeyboardInterrupt  # out of the sync job running in this thread

    def _settle_pending(self) -> None:
        """Stopping with outcomes the server did not take (their settle failed): try again
        after a pause until it answers, the drain timeout passes or a second signal comes,
        instead of leaving finished jobs to be reaped as stalls and run again."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.drain_timeout
        failures = 0
        while self._drainer.pending and not self._cut:
            left = self._stop_deadline - time.monotonic()
            if left <= 0:
                log.warning("queue %s: drain timeout: leaving %d unsettled outcome(s); their "
                            "leases will expire", self.queue.name, len(self._drainer.pending))
                return
            failures += 1
            select.select([self._stop_r], [], [],
                          retry_pause(failures, min(left, MAX_RECONNECT_WAIT_S), doublings=7))
            self._drain_stop_pipe()
            try:
                self._drainer.settle(self._drainer.pending, resent=True)
            except UNAVAILABLE_ERRORS as exc:
                if failures == 1:
                    log.warning("queue %s: %d unsettled outcome(s) kept until the server "
                                "answers (at most until the drain timeout): %s",
                                self.queue.name, len(self._drainer.pending), exc)

    def _past_deadline(self) -> None:
        """The drain timeout passed with a sync job still running in the main thread."""
        if self._running and self._main_ident is not None:
            log.warning("queue %s: drain timeout: interrupting the running job, which goes "
                        "back counting a stall", self.queue.name)
            signal.pthread_kill(self._main_ident, self._stop_signal)

    def _finish_pool(self, pool: ConcurrentDrain) -> None:
        """Wait for the pool's running jobs to finish and settle until the drain timeout (or
        a second signal); then have it hand them back counting a stall."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.drain_timeout
        if not self._cut and pool.join(max(0.0, self._stop_deadline - time.monotonic())):
            return
        if not self._cut:  # the deadline passed
            log.warning("queue %s: drain timeout: handing back %d running job(s), counting "
                        "a stall", self.queue.name, len(self._running))
        pool.give_up()  # after a second signal's own give_up, a no-op
        if not pool.join(GIVE_UP_WAIT_S):
            log.warning("queue %s: the drain did not end; leases it holds will expire",
                        self.queue.name)

    def _heartbeat(self) -> None:
        """Extend the leases in hand every third of a lease period; after a failure, try
        again a beat later, so the leases are extended and the outage measured (for the
        reap's grace, reapgrace.py) within a beat of the server's return. Seen from here,
        an outage the main loop does not see (it runs a job) holds its next reap too."""
        interval = self.settings.lease_ms / 3000
        retry = min(interval, self.settings.beat_ms / 1000)
        wait, failing = interval, False
        while not self._heartbeat_stop.wait(wait):
            wait = interval
            with self._held_lock:
                held = list(self._held.items())
            if not held:
                continue
            try:
                self.lanes.extend(held)
            except UNAVAILABLE_ERRORS as exc:
                self._grace.failed(time.monotonic())
                if not failing:  # once an outage
                    log.warning("queue %s: lease extension failed: %s", self.queue.name, exc)
                wait, failing = retry, True
            else:
                self._grace.answered(time.monotonic())
                failing = False

    def _drain_stop_pipe(self) -> None:
        try:
            while os.read(self._stop_r, 64):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Release the stop pipe. The consumer cannot run again afterwards."""
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
