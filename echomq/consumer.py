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
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.exceptions

from echomq import loops, scripts
from echomq.concurrent import ConcurrentDrain
from echomq.config import QueueSettings
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.drain import Drain
from echomq.job import Claimed
from echomq.lanes import Lanes, Outcome, record_lane_limit
from echomq.queue import Queue
from echomq.runner import HandlerLike, Runner
from echomq.scripts import Settled
from echomq.wake import Doorbell, claim_doorbell

log = logging.getLogger("echomq.consumer")
MAX_RECONNECT_WAIT_S = 5.0


class Consumer:
    """Runs ``handler(job)`` for the jobs of one queue until :meth:`stop`."""

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
        settings: QueueSettings | None = None,
        **overrides: Any,
    ) -> None:
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
        self.runner = Runner(self.queue.name, handler, self.settings,
                             progress=self.lanes.progress)
        self.processed = 0
        self._stopping = False
        self._stop_r, self._stop_w = os.pipe()
        os.set_blocking(self._stop_r, False)
        os.set_blocking(self._stop_w, False)
        self._held: dict[str, str] = {}
        self._held_lock = threading.Lock()
        self._drainer = Drain(self.lanes, self.runner, self)
        # no claim sent ahead: a standalone consumer keeps no claims record and has no
        # parent, so jobs claimed ahead that it never held would only come back by lease
        # expiry if it died, charged a stall they did not earn
        self._drainer.send_ahead = False
        self._concurrent = self.settings.concurrency > 1 or self.runner.has_async()
        self._pool: ConcurrentDrain | None = None  # a fresh one per run() when concurrent

    # --- control ---------------------------------------------------------------

    def stop(self) -> None:
        """End the loop after the job in hand; safe from a signal handler or another thread."""
        self._stopping = True
        if self._pool is not None:
            self._pool.stop(abandon=True)
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
        """Consume until stopped (with ``burst``: until nothing is claimable). Returns jobs run."""
        keys = self.queue.keys
        doorbell = Doorbell(self.queue.redis, keys, self.settings.beat_ms / 1000,
                            self.settings.doorbell)
        self._server_offset_ms: float | None = None  # server clock minus monotonic, in ms
        self._schedule_head_ms: float | None = None
        claimed_bell = False
        beat_s = self.settings.beat_ms / 1000
        lease_s = self.settings.lease_ms / 1000
        heartbeat = threading.Thread(target=self._heartbeat, name="echomq-heartbeat", daemon=True)
        heartbeat_stop = threading.Event()
        self._heartbeat_stop = heartbeat_stop
        heartbeat.start()
        if self._concurrent:
            self._pool = ConcurrentDrain(self.lanes, self.runner, self, self.settings.concurrency)
            self._pool.start()
        next_promote = next_reap = 0.0  # monotonic deadlines; 0 = now
        failures = 0
        work = True  # drain on the first pass, then only when a ring or the pump found work
        try:
            while not self._stopping:
                try:
                    if failures:
                        scripts.load_all(self.queue.redis, keys.prefix)
                    if not claimed_bell:  # refuses (DoorbellMismatch) a queue of the other kind
                        claim_doorbell(self.queue.redis, keys, doorbell.kind)
                        if self.queue.settings.lane_limit is not None:
                            record_lane_limit(self.queue.redis, keys,
                                              self.queue.settings.lane_limit)
                        claimed_bell = True
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
                    doorbell.reset()
                    wait = min(MAX_RECONNECT_WAIT_S, 0.05 * 2 ** min(failures, 7))
                    log.warning("queue %s: server unreachable (%s); retrying in %.2fs",
                                self.queue.name, exc, wait)
                    # wait on the stop pipe: stop() ends the wait at once
                    select.select([self._stop_r], [], [], wait)
                    next_promote = next_reap = 0.0
                    work = True
        except KeyboardInterrupt:
            self._release_held("requeue")
            raise
        finally:
            if self._pool is not None:
                self._pool.stop(abandon=True)
                self._pool.join()
            heartbeat_stop.set()
            doorbell.close()
            heartbeat.join(timeout=5)
        return self.processed

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
            sent = time.monotonic()
            promoted, next_due, server_now = scripts.promote(self.queue.redis, self.queue.keys,
                                                             batch)
            total += promoted
            if promoted < batch:
                break
        # with nothing scheduled, the BLPOP's own timeout ends the park and marks the beat;
        # the local timer is only for a schedule head due before that
        wait = beat_s + 1.0 if next_due < 0 else (next_due - server_now) / 1000
        # the server read its clock about halfway through the round trip
        self._server_offset_ms = server_now - (sent + time.monotonic()) * 500
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
        """Drain hook: how many jobs the next claim may take."""
        return self.runner.batch_size()

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        """Drain hook: the claimed batch is held (its leases are kept alive)."""
        self._hold(batch)

    def on_start(self, claimed: Claimed, in_thread: bool = True) -> None:
        """Drain hook: a job's handler is about to run."""
        self.processed += 1

    def on_finish(self, claimed: Claimed) -> None:
        """Nothing to do: the job stays held (and extended) until its outcome is settled."""

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

    def _release_held(self, mode: str) -> None:
        with self._held_lock:
            held = list(self._held.items())
            self._held.clear()
        try:
            self.lanes.release(held, mode)
        except UNAVAILABLE_ERRORS:
            log.warning("queue %s: could not hand back %d jobs; their leases will expire",
                        self.queue.name, len(held))

    def _heartbeat(self) -> None:
        """Extend the leases in hand every third of a lease period."""
        interval = self.settings.lease_ms / 3000
        while not self._heartbeat_stop.wait(interval):
            with self._held_lock:
                held = list(self._held.items())
            if not held:
                continue
            try:
                self.lanes.extend(held)
            except UNAVAILABLE_ERRORS as exc:
                log.warning("queue %s: lease extension failed: %s", self.queue.name, exc)

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
