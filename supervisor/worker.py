"""The forked child's loop: wait on the pipe, claim while claims return work, report idle.

A child never blocks on Valkey and never sleeps: between drains it is
blocked in ``recv`` on its socketpair until the parent pokes it. What it holds
and runs is written to its shared :class:`Holdings` table as it changes, so the
parent knows it at every moment without a message per job.
"""

from __future__ import annotations

import logging
import os
import random
import select
import signal
import socket
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, NoReturn

from echomq.supervisor import protocol
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.metronome import PARK_BEATS
from echomq.supervisor.observations import Observations

from echomq import scripts
from echomq.backoff import retry_pause
from echomq.concurrent import ConcurrentDrain, max_held
from echomq.config import QueueSettings
from echomq.connection import UNAVAILABLE_ERRORS, client_from_url, is_cluster, refusal_code
from echomq.drain import Drain
from echomq.errors import FloorError
from echomq.floor.writethrough import write_through
from echomq.job import Claimed
from echomq.keys import Keys
from echomq.lanes import Lanes, Outcome
from echomq.middleware import build
from echomq.parkclaim import ClaimingDoorbell
from echomq.runner import Runner
from echomq.scripts import Settled
from echomq.wake import BLOCK_GRACE_S, Doorbell, ring

log = logging.getLogger("echomq.worker")
MAX_SETTLE_WAIT_S = 2.0
# an async job past its limit is cancelled here; the parent ends the process only if this
# much later the job still runs (a handler that blocks the event loop)
ASYNC_GRACE_S = 2.0


class Worker:
    """One child process serving one queue."""

    def __init__(self, sock: socket.socket, queue: str, redis_url: str,
                 settings: QueueSettings, handler: Callable[..., Any],
                 max_jobs: int | None, floor_url: str | None = None,
                 holdings: Holdings | None = None, claimer: str = "",
                 middleware: Sequence[Any] = ()) -> None:
        self.sock = sock
        self.holdings = holdings or Holdings(max_held(settings.concurrency, settings.claim_batch))
        self.queue = queue
        self.settings = settings
        self.max_jobs = max_jobs
        self.client = client_from_url(redis_url)
        self.lanes = Lanes(self.client, Keys(queue), settings)
        self.lanes.claimer = claimer  # the parent hands back what it claimed but never held
        self.observations = Observations()
        self.runner = Runner(queue, handler, settings, progress=self.lanes.progress,
                             observer=self.observations.fold,
                             middleware=[build(target) for target in middleware])
        self.stopping = False
        self.jobs_run = 0
        self.report_jobs = 0
        self.report_wait_us = 0
        self.drain = Drain(self.lanes, self.runner, self)
        # no claim ahead where a settle must be read before the next job starts (a retry
        # written through to the floor) or where a claim must stop at the jobs left
        if (floor_url and settings.durability == "sync") or max_jobs is not None:
            self.drain.send_ahead = False
        if floor_url and settings.durability == "sync":
            self.drain.retries_early = False  # a batch's early settles stop at a retry
        self.pool: ConcurrentDrain | None = None
        if settings.concurrency > 1 or self.runner.has_async():
            self.pool = ConcurrentDrain(self.lanes, self.runner, self, settings.concurrency)
        self.parent_gone = False
        self.doorbell: Doorbell | None = None  # parked on while the parent hands it over
        self.took_ring = False  # the last park ended with a ring its call took
        self.parent_pid = os.getppid()  # the supervisor: another parent means it died
        self.claimed_at = 0.0
        self.floor: Any = None
        if floor_url and settings.durability == "sync":
            from echomq.floor import Floor

            # opened after the fork: an engine's pooled connections must never cross one
            self.floor = Floor.from_url(floor_url, busy_timeout_ms=1000, connect_timeout_s=2)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True  # recorded only; the loop checks it between jobs

    def boot(self) -> None:
        """Get ready to serve. Raises only what respawning would not cure: a server that
        is unreachable or refusing now is met again, and waited for, at the first drain."""
        signal.signal(signal.SIGTERM, self._on_term)
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the parent decides what these mean
        for sig in (signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        try:
            # an early load only: scripts also load on first use
            scripts.load_all(self.client, self.lanes.keys.prefix)
        except UNAVAILABLE_ERRORS as exc:
            log.info("queue %s: scripts not loaded at start (%s); loading on first use",
                     self.queue, exc)

    def serve(self) -> int:
        """Run until told to stop; returns the exit code."""
        # one job at a time in this process: it can park on the doorbell itself (B)
        ready = protocol.READY if self.pool is not None else f"{protocol.READY} {protocol.PARKS}"
        self._send(ready.encode() + b"\n")
        if self.pool is not None:
            return self._serve_pool(self.pool)
        while True:
            data = self._read_pipe()
            if protocol.BELL in data and not (protocol.POKE in data or protocol.STOP in data
                                              or self.stopping):
                parked = self._park()
                if parked is None:
                    continue
                if self.took_ring and self.stopping and not self._bell().claimed_at_pop():
                    # a stop came after its call took a ring: that ring is for the others
                    # (unless the claim behind the pop took its work: handed back, rung)
                    self._ring_again(self._bell())
                data = parked
            if not data or protocol.STOP in data or self.stopping:
                return self._settle_then_exit(parent_gone=not data)
            if protocol.POKE in data:
                self._drain_safely()
                if not self.parent_gone:
                    self._send_observations(force=True)
                    self._send(protocol.idle_line(self.report_jobs, self.report_wait_us))
                    self.report_jobs = self.report_wait_us = 0
            if self.stopping:
                return self._settle_then_exit(parent_gone=self.parent_gone)
            if self.max_jobs is not None and self.jobs_run >= self.max_jobs:
                return protocol.EXIT_RECYCLE

    def _read_pipe(self) -> bytes:
        """What the parent wrote (b"" when it is gone)."""
        try:
            return self.sock.recv(64)
        except InterruptedError:
            return protocol.POKE
        except ConnectionError:
            return b""  # the parent is gone: leave like at EOF, without a traceback

    def _park(self) -> bytes | None:
        """Park on the queue's doorbell (the parent handed it over, B) beside the pipe, so
        a ring wakes this process, which claims at once (on a plain server the claim is
        written behind the pop and comes back with the ring, echomq.parkclaim). Returns POKE
        when a ring was taken or a claim leased jobs (``took_ring`` set for a ring; the
        caller drains, starting with those jobs), what the pipe said when it ended the
        park (the call cancelled, what it took put back; UNPARKED said unless it was a
        poke, which told the parent already), or None when the park failed on this
        process's connection (UNPARKED said: the parent parks instead). Another B while
        parked changes nothing: the park goes on."""
        bell = self._bell()
        self.took_ring = False
        try:
            while True:
                # the server ends the call after its block; past that and a grace, wait()
                # drops a connection that died without a word
                rung, woke = bell.wait(bell.beat_s + BLOCK_GRACE_S, self.sock.fileno())
                due = bell.take_due()
                self._take_claimed(bell)
                data = self._read_pipe() if woke else None
                if self.stopping or (data is not None and (not data or protocol.STOP in data)):
                    if rung and not bell.claimed_at_pop():
                        self._ring_again(bell)  # a ring taken, not acted on: for the others
                    bell.cancel()
                    self._take_claimed(bell)  # handed back by _settle_then_exit
                    return protocol.STOP if data is None else data
                if due is not None:  # a schedule head: the parent's promote timer
                    self._send(protocol.rung_line(due))
                if rung or self.drain.first or self.drain.claim_unknown:
                    # a claim whose reply was lost is settled by a drain now (it hands back
                    # what the claims record names beyond what is held), not at a later ring
                    self.took_ring = rung
                    self._send(protocol.rung_line())
                    return protocol.POKE
                rest = None if data is None else data.replace(protocol.BELL, b"")
                if rest:
                    bell.cancel()
                    self._take_claimed(bell)
                    if protocol.POKE in rest:  # the parent counts it busy already
                        return rest
                    if self.drain.first or self.drain.claim_unknown:
                        # the cancelled call's claim leased jobs, or may have: drain now
                        self._send(protocol.rung_line())
                        return rest + protocol.POKE
                    self._send(f"{protocol.UNPARKED}\n".encode())
                    return rest
                if not bell.armed and due is None:  # its block ran out: still parked
                    self._send(f"{protocol.PARKED}\n".encode())
        except UNAVAILABLE_ERRORS as exc:
            bell.reset()
            self._take_claimed(bell)
            log.info("queue %s: parked call on the doorbell failed (%s); the supervisor "
                     "parks instead", self.queue, exc)
            self._send(f"{protocol.UNPARKED}\n".encode())
            if not (self.drain.claim_unknown or self.drain.first):
                return None
            # a claim whose reply was lost: drain now (it hands back what the claims record
            # names beyond what is held, retrying until the server answers), busy for the
            # parent, which extends the leases meanwhile and hands the doorbell to another
            self._send(protocol.rung_line())
            return protocol.POKE

    def _take_claimed(self, bell: Doorbell) -> None:
        """What the claims behind the doorbell's pops leased goes to the next drain; a
        claim whose reply was lost makes that drain hand back what it does not hold."""
        if not isinstance(bell, ClaimingDoorbell):
            return
        claimed, unknown = bell.take()
        if unknown:
            self.drain.claim_unknown = True
        if claimed:
            self.drain.first = [*(self.drain.first or ()), *claimed]

    def _hand_back_first(self) -> None:
        """Jobs leased for a drain that will not run (this process stops) go back to their
        lanes uncharged. When the server cannot be reached, the parent's hand-back at this
        process's exit finds them in its claims record."""
        first, self.drain.first = self.drain.first, None
        if not first:
            return
        try:
            self.lanes.release([(c.id, c.token) for c in first], "unstarted")
        except UNAVAILABLE_ERRORS as exc:
            log.info("queue %s: %d claimed job(s) not handed back (%s); the supervisor "
                     "hands them back", self.queue, len(first), exc)

    def _ring_again(self, bell: Doorbell) -> None:
        """Ring the doorbell for a ring this process took and leaves unclaimed."""
        try:
            ring(self.client, self.lanes.keys, bell.kind)
        except UNAVAILABLE_ERRORS:
            pass  # the server is gone too: the others' safety promote and reap remain

    def _bell(self) -> Doorbell:
        """This process's own doorbell call, made at the first park: on a plain server it
        carries the claim of one job behind each pop (chained, as a drain's first claim)."""
        if self.doorbell is None:
            beat_s = self.settings.beat_ms / 1000 * PARK_BEATS
            if is_cluster(self.client):
                self.doorbell = Doorbell(self.client, self.lanes.keys, beat_s,
                                         self.settings.doorbell)
            else:
                self.doorbell = ClaimingDoorbell(self.client, self.lanes.keys, beat_s,
                                                 self.settings.doorbell,
                                                 self.lanes.claim_call(1, chain=True))
        return self.doorbell

    def _drain_safely(self) -> None:
        """Drain; when the server cannot be reached or refuses, drain again after a backoff
        until it answers. Only this process's connection may have failed, and then the
        supervisor sees no outage and pokes nobody: the outcomes the drain could not settle
        and the jobs a claim leased unseen are finished here, not at the next poke (the
        parent keeps extending their leases while this child has not said IDLE). A poke
        retries at once; a stop or the parent leaving ends the retries."""
        failures = 0
        refused = ""
        while True:
            try:
                self.drain.run()
                return
            except UNAVAILABLE_ERRORS as exc:
                failures += 1
                code = refusal_code(exc)
                if code and code != refused:  # the parent cannot always see a refusal
                    refused = code
                    self._send(protocol.refused_line(code, str(exc)))
                elif not code and (failures == 1 or failures % 20 == 0):
                    log.warning("queue %s: server unreachable while draining (%d "
                                "outcome(s) kept, trying again): %s", self.queue,
                                len(self.drain.pending), exc)
            if self.stopping:
                return
            data = self._wait_on_pipe(failures)
            if data is not None and (not data or protocol.STOP in data):
                self.parent_gone = not data
                self.stopping = True
            if self.stopping:  # a SIGTERM meanwhile too
                return

    def _wait_on_pipe(self, failures: int) -> bytes | None:
        """The backoff after the ``failures``-th failure in a row (at most a beat): no
        event says the server is back, so wait on the pipe for that long (what the parent
        writes ends the wait). Returns what was read (b"" when the parent is gone), None at
        the timeout."""
        wait = retry_pause(failures, min(MAX_SETTLE_WAIT_S, self.settings.beat_ms / 1000))
        readable, _, _ = select.select([self.sock], [], [], wait)
        if not readable:
            return None
        try:
            return self.sock.recv(64)
        except InterruptedError:
            return None
        except ConnectionError:
            return b""

    def _serve_pool(self, pool: ConcurrentDrain) -> int:
        """Concurrent mode: the event loop runs here and watches the pipe."""
        self.sock.setblocking(False)

        def on_term() -> None:  # recorded and acted on in the loop, like a STOP line
            self.stopping = True
            pool.stop()

        pool.serve(self.sock.fileno(), self._on_pipe, on_term)
        if self._recycle_due() and not self.stopping:
            return protocol.EXIT_RECYCLE
        return protocol.EXIT_OK

    def _on_pipe(self) -> None:
        assert self.pool is not None
        try:
            data = self.sock.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data or protocol.STOP in data:
            self.parent_gone = not data
            self.stopping = True
            # with the parent gone nobody extends leases: unsettled outcomes are given up
            self.pool.stop(abandon=self.parent_gone)
        else:
            if protocol.CANCEL in data:
                self.pool.check_cancels()
            if protocol.POKE in data:
                self.pool.poke()

    def _settle_then_exit(self, parent_gone: bool = False) -> int:
        """Never leave with outcomes unsettled: retry until the server answers. The parent
        keeps their leases meanwhile and, at its drain deadline, ends this process and
        hands the jobs back. A schedule head its doorbell took is put back first."""
        if self.doorbell is not None:
            self.doorbell.close()
            self._take_claimed(self.doorbell)
        self._hand_back_first()
        failures = 0
        while self.drain.pending:
            try:
                self.drain.settle(self.drain.pending)
            except UNAVAILABLE_ERRORS as exc:
                failures += 1
                if failures == 1:
                    log.warning("queue %s: %d unsettled outcome(s) kept until the server "
                                "answers: %s", self.queue, len(self.drain.pending), exc)
                if parent_gone:
                    break  # nobody extends their leases now: they expire and run again
                # no event says the server is back; wait on the pipe so EOF ends the wait
                if self._wait_on_pipe(failures) == b"":
                    parent_gone = True
        return protocol.EXIT_OK

    # --- drain hooks ---------------------------------------------------------------

    def stop_requested(self) -> bool:
        """Drain hook: True once a stop was asked for, the process is due to recycle, or its
        supervisor died (nobody extends its leases now: a job it started would be reaped
        under the next supervisor and charged a stall; what it has not started goes back)."""
        if not self.stopping and os.getppid() != self.parent_pid:
            log.warning("queue %s: the supervisor is gone; handing back what has not "
                        "started, then leaving", self.queue)
            self.stopping = self.parent_gone = True
        return self.stopping or self._recycle_due()

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        """Drain hook: hold the claimed batch in the table the supervisor reads."""
        self.claimed_at = time.perf_counter()
        self._send_observations(force=False)
        self.holdings.hold((c.id, c.token) for c in batch)

    def on_start(self, claimed: Claimed, in_thread: bool = True) -> None:
        """Drain hook: mark the job running (and its time limit) in the shared table."""
        self.report_wait_us += int((time.perf_counter() - self.claimed_at) * 1e6)
        self.jobs_run += 1
        self.report_jobs += 1
        timeout = self.runner.timeout_of(claimed)
        # a sync handler cannot be interrupted here: the parent ends this process at the
        # deadline (an async one is cancelled by the runner; the parent only backs it up)
        deadline = 0.0
        if timeout:
            deadline = time.monotonic() + timeout + (0.0 if in_thread else ASYNC_GRACE_S)
        self.holdings.start(claimed.id, deadline, timeout or 0.0, in_thread)

    def on_finish(self, claimed: Claimed) -> None:
        """Drain hook: mark the job finished, its outcome not settled yet."""
        self.holdings.finish(claimed.id)

    def on_unstarted(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Drain hook: these jobs went back unstarted; drop them from the table."""
        self.holdings.drop_pairs(pairs)

    def after_settle(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        """Drain hook: drop settled jobs and write their retries through to the floor."""
        self.holdings.drop_pairs((o.job_id, o.token) for o in outcomes)
        self._write_retries(outcomes, codes)

    def _write_retries(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        """Durability "sync": a retry is on the floor before the next job starts."""
        if self.floor is None:
            return
        retries = [o.job_id for o, c in zip(outcomes, codes, strict=True)
                   if c is Settled.RETRYING]
        if not retries:
            return
        try:
            write_through(self.client, self.lanes.keys, self.floor, retries)
        except FloorError as exc:  # the scheduler folds them within a beat instead
            log.warning("queue %s: sync write of %d retries failed: %s", self.queue,
                        len(retries), exc)

    def on_dry(self) -> None:
        """Drain hook: the queue ran dry; report IDLE (jobs run, wait time) to the parent."""
        self._send_observations(force=True)
        self._send(protocol.idle_line(self.report_jobs, self.report_wait_us))
        self.report_jobs = self.report_wait_us = 0

    def batch_size(self) -> int:
        """Drain hook: the next claim's size, capped by the jobs left before a recycle."""
        size = self.runner.batch_size()
        if self.max_jobs is not None:
            size = max(1, min(size, self.max_jobs - self.jobs_run))
        return size

    def _recycle_due(self) -> bool:
        return self.max_jobs is not None and self.jobs_run >= self.max_jobs

    def _send_observations(self, force: bool) -> None:
        line = self.observations.line(force)
        if line is not None:
            self._send(line)

    def _send(self, line: bytes) -> None:
        try:
            self.sock.sendall(line)
        except BlockingIOError:
            log.warning("queue %s: pipe to the supervisor is full; line dropped", self.queue)


def run_child(sock: socket.socket, queue: str, redis_url: str, settings: QueueSettings,
              handler: Callable[..., Any], max_jobs: int | None,
              floor_url: str | None = None, holdings: Holdings | None = None,
              claimer: str = "", middleware: Sequence[Any] = ()) -> NoReturn:
    """Entry point right after fork: serve, then leave without running the parent's atexit."""
    code = protocol.EXIT_OK
    random.seed()
    try:
        try:
            worker = Worker(sock, queue, redis_url, settings, handler, max_jobs, floor_url,
                            holdings, claimer, middleware)
            worker.boot()
        except Exception as exc:  # before READY: say BOOTFAIL, whatever the exit code says
            log.error("queue %s: consumer could not start: %s: %s", queue,
                      type(exc).__name__, exc)
            try:
                sock.sendall(protocol.bootfail_line(f"{type(exc).__name__}: {exc}"))
            except OSError:
                pass
            code = protocol.EXIT_BOOT_FAILED
        else:
            code = worker.serve()
    except BaseException:  # the child must never return into the parent's code
        log.exception("queue %s: consumer process failed", queue)
        code = 1
    finally:
        logging.shutdown()
    os._exit(code)
