"""The arbiter: one selector loop over signals, child pipes and the metronomes' BLPOPs.

Nothing here sleeps. The loop blocks in ``selector.select`` with a timeout
equal to the nearest local deadline (a schedule head, a lease head, a lease
extension, a respawn, the drain deadline) and acts on whatever woke it.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from echomq.supervisor import protocol
from echomq.supervisor.children import Child, fork_child, sever_client
from echomq.supervisor.handlers import load_handler
from echomq.supervisor.holdings import FINISHED, HELD, RUNNING, Held, runs_by_mode
from echomq.supervisor.logs import event
from echomq.supervisor.metronome import Metronome
from echomq.supervisor.observations import Tally
from echomq.supervisor.outage import Availability
from echomq.supervisor.recycle import over_memory
from echomq.supervisor.settings import QueueSpec, Settings
from echomq.supervisor.signals import SignalPipe, sever

from echomq import scripts
from echomq.config import QueueSettings
from echomq.connection import UNAVAILABLE_ERRORS, client_from_url, redact_url
from echomq.keys import REGISTRY, Keys
from echomq.lanes import Lanes, Outcome, record_lane_limit, unheld_claims
from echomq.runner import retry_ms_of, timed_out_text
from echomq.wake import DoorbellMismatch, claim_doorbell, ring

log = logging.getLogger("echomq.supervisor")
CRASH_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 30.0  # a child that lived this long was not crash-looping
FORK_RETRY_S = 0.005  # a floor call under way (scheduler thread) delays a fork this long
RECYCLE_CHECK_S = 5.0
EXIT_DOORBELL = 2  # the queue's doorbell was switched to the other kind (as cli's EXIT_USAGE)
# what a dead child's jobs cost them: only the one that was running is charged a stall;
# one that finished (outcome not settled) or never started runs again without a charge
RELEASE_MODES = {RUNNING: "stall", FINISHED: "unstarted", HELD: "unstarted"}
# several were running: which one killed the process is not known, so none is charged and
# each runs alone next time (a crash during a lone run is its own)
SUSPECT_MODES = {RUNNING: "suspect", FINISHED: "unstarted", HELD: "unstarted"}
UNCHARGED = {RUNNING: "unstarted", FINISHED: "unstarted", HELD: "unstarted"}


class BootFailed(Exception):
    """A child could not start (it said BOOTFAIL): respawning would not help."""


@dataclass
class Slot:
    """A place for one consumer process; survives the processes that fill it."""

    index: int
    child: Child | None = None
    crashes: int = 0
    respawn_at: float | None = 0.0


@dataclass
class QueueRuntime:
    """Everything the arbiter keeps for one queue."""

    spec: QueueSpec
    settings: QueueSettings
    handler: Callable[..., Any]
    metronome: Metronome
    slots: list[Slot]
    availability: Availability
    work_seen: float = 0.0
    claim_jobs: int = 0
    claim_wait_us: int = 0
    restarts: int = 0
    scheduler: Any = None
    children_by_fd: dict[int, Child] = field(default_factory=dict)
    # hand-backs of dead children's jobs the server did not take (it was unreachable):
    # ("claims", claimer name, {(id, token) held}) or ("jobs", [(id, token)], mode);
    # retried before the reap can charge their expired leases a stall, their leases
    # extended meanwhile
    unreleased: list[tuple[str, Any, Any]] = field(default_factory=list)

    @property
    def children(self) -> list[Child]:
        """The queue's live consumer processes."""
        return [s.child for s in self.slots if s.child is not None]

    @property
    def healthy(self) -> bool:
        """True while Valkey takes this queue's writes (no refusal, no outage)."""
        return self.availability.ok


def epoll_ms(timeout: float) -> int:
    """The milliseconds epoll waits for a selector timeout: EpollSelector rounds it up to
    whole ms, then CPython rounds the float up to ns and the ns up to ms (so 0.009 s,
    a hair above 9 ms as a float, waits 10)."""
    seconds = math.ceil(timeout * 1e3) * 1e-3
    return -(-math.ceil(seconds * 1e9) // 1_000_000)


def whole_ms(timeout: float) -> float:
    """A selector timeout that epoll waits no longer than: whole milliseconds, rounded
    down. The loop wakes up to two milliseconds before its deadline, never after it."""
    ms = max(0, math.floor(timeout * 1000))
    while ms > 0 and epoll_ms(ms / 1000) > timeout * 1000:
        ms -= 1
    return ms / 1000


def _sleep_until(deadline: float) -> None:
    """Sleep off what is left of a deadline that epoll woke up to two milliseconds before
    (a delayed job's due time): clock_nanosleep has the precision epoll lacks, and no
    event is waited for in that sliver of time."""
    left = deadline - time.monotonic()
    if 0.0 < left <= 0.002:
        time.sleep(left)  # a timer, not an event: nothing else marks the deadline


class Arbiter:
    """Runs the queues of one supervisor until SIGTERM/SIGINT, then drains and returns 0."""

    def __init__(self, settings: Settings, *, floor: Any = None,
                 scheduler_factory: Callable[[QueueRuntime], Any] | None = None) -> None:
        self.settings = settings
        # a short timeout: a stalled server must not hold the whole loop (signals, children)
        # for long; every call here is a bounded script or a small pipeline
        self.client = client_from_url(settings.redis_url, socket_timeout=3.0)
        self.where = redact_url(settings.redis_url)
        self.floor = floor
        self.queues: dict[str, QueueRuntime] = {}
        for spec in settings.queues:
            qs = QueueSettings(beat_ms=settings.beat_ms, lease_ms=settings.lease_ms,
                               durability=settings.durability_of(spec),
                               keep_dead=settings.keep_dead, keep_dead_s=settings.keep_dead_s,
                               doorbell=settings.doorbell, concurrency=settings.concurrency,
                               job_timeout=settings.job_timeout,
                               lane_limit=settings.lane_limit)
            self.queues[spec.name] = QueueRuntime(
                spec=spec, settings=qs, handler=load_handler(spec),
                metronome=Metronome(spec.name, self.client, qs),
                slots=[Slot(i) for i in range(spec.processes)],
                availability=Availability(spec.name, self.where, settings.beat_ms / 1000),
            )
        if scheduler_factory is not None:
            for rt in self.queues.values():
                rt.scheduler = scheduler_factory(rt)
        self.selector = selectors.DefaultSelector()
        self.signals: SignalPipe | None = None
        self.stopping = False
        self.drain_deadline: float | None = None
        self.next_extend = 0.0
        self.next_recycle = 0.0
        self.last_loop = time.monotonic()
        self.started = time.time()
        self.exit_code = 0
        self.forget_in_child: list[Callable[[], None]] = []
        self.pids: dict[int, Child] = {}
        self.observed = Tally()  # the children's job observations, for /metrics

    # --- lifecycle -------------------------------------------------------------------

    def run(self) -> int:
        """Run until a stop signal and the drain end; returns the exit code."""
        self.signals = SignalPipe()
        self.selector.register(self.signals.fileno(), selectors.EVENT_READ, "signals")
        self.forget_in_child.append(self.signals.forget_in_child)
        self.forget_in_child.append(lambda: sever_client(self.client))
        if self.floor is not None:
            self.forget_in_child.append(self.floor.forget_after_fork)
        for rt in self.queues.values():
            self.forget_in_child.append(lambda rt=rt: self._forget_doorbell(rt))
            self._prepare_queue(rt, at_start=True)
        event(log, "start", "supervisor started: %s, queues %s", self.where,
              ", ".join(f"{q}×{rt.spec.processes}" for q, rt in self.queues.items()),
              pid=os.getpid())
        try:
            while True:
                self._loop_once()
                if self.stopping and not self.pids:
                    break
            for rt in self.queues.values():  # a last try: what stays leased will be reaped
                if rt.unreleased:
                    self._retry_releases(rt)
        except BootFailed as exc:
            log.error("%s", exc)
            self._kill_all()
            self.exit_code = protocol.EXIT_BOOT_FAILED
        finally:
            for rt in self.queues.values():
                rt.metronome.doorbell.close()
                if rt.scheduler is not None:
                    rt.scheduler.close()
            self.signals.close()
        event(log, "exit", "supervisor exiting with %d", self.exit_code, exit=self.exit_code)
        return self.exit_code

    def _prepare_queue(self, rt: QueueRuntime, at_start: bool = False) -> None:
        try:
            self._declare_queue(rt)
        except DoorbellMismatch as exc:
            if at_start:
                raise
            # switched while this supervisor could not reach Valkey: its parked call would
            # never be rung again
            log.error("%s", exc)
            self.exit_code = EXIT_DOORBELL
            self._begin_drain()
        except UNAVAILABLE_ERRORS as exc:
            self._queue_down(rt, time.monotonic(), exc)

    def _declare_queue(self, rt: QueueRuntime) -> None:
        """Load the scripts and write the queue's meta: a write, so it is also the probe
        that tells a server refusing writes from one taking them again."""
        scripts.load_all(self.client, Keys(rt.spec.name).prefix)
        durability = rt.settings.durability or "volatile"
        # "fold" is the scheduler's lease (lead.lua), not set here
        self.client.hset(Keys(rt.spec.name).meta, mapping={"durability": durability})
        self.client.sadd(REGISTRY, rt.spec.name)  # `echomq queues` lists it
        claim_doorbell(self.client, rt.metronome.keys, rt.settings.doorbell,
                       switch=self.settings.switch_doorbell)
        if rt.settings.lane_limit is not None:
            record_lane_limit(self.client, rt.metronome.keys, rt.settings.lane_limit)

    def _loop_once(self) -> None:
        now = time.monotonic()
        self.last_loop = now
        self._arm_doorbells(now)
        deadline = self._next_deadline()
        events = self.selector.select(whole_ms(deadline - time.monotonic()))
        if not events:
            _sleep_until(deadline)
        for key, _ in events:
            if key.data == "signals":
                assert self.signals is not None
                for signum in self.signals.read():
                    self._on_signal(signum)
            elif isinstance(key.data, Child):
                self._on_child_readable(key.data)
            elif isinstance(key.data, QueueRuntime):
                self._on_ring(key.data)
        self._on_timers(time.monotonic())

    def _next_deadline(self) -> float:
        deadlines = [time.monotonic() + 5.0]
        if not self.stopping:
            deadlines += [rt.metronome.deadline() for rt in self.queues.values()]
            deadlines += [s.respawn_at for rt in self.queues.values() for s in rt.slots
                          if s.respawn_at is not None and s.child is None and rt.healthy]
            deadlines += [rt.scheduler.deadline() for rt in self.queues.values()
                          if rt.scheduler is not None]
        if any(rt.children for rt in self.queues.values()):
            deadlines.append(self.next_extend)
        deadlines += [d for rt in self.queues.values() for c in rt.children
                      if not c.timed_out and (d := c.holdings.deadline())]
        if self.settings.max_memory_mb:
            deadlines.append(self.next_recycle)
        if self.drain_deadline is not None:
            deadlines.append(self.drain_deadline)
        return min(deadlines)

    # --- signals ---------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGCHLD:
            self._reap_children()
        elif signum in (signal.SIGTERM, signal.SIGINT):
            name = signal.Signals(signum).name
            if self.stopping and signum == signal.SIGINT:
                event(log, "drain-abort", "second SIGINT: stopping now, requeueing jobs",
                      signal=name)
                self._kill_all()
            elif not self.stopping:
                event(log, "drain", "%s: draining (up to %.1fs)", name,
                      self.settings.drain_timeout, signal=name)
                self._begin_drain()
        elif signum == signal.SIGHUP and not self.stopping:
            self._roll()

    def _begin_drain(self) -> None:
        self.stopping = True
        self.drain_deadline = time.monotonic() + self.settings.drain_timeout
        for rt in self.queues.values():
            self._unregister_doorbell(rt)
            rt.metronome.doorbell.cancel()
            for child in rt.children:
                self._stop_child(child)

    def _roll(self) -> None:
        """SIGHUP: reload handler modules, then replace each child once it finishes its job."""
        for rt in self.queues.values():
            try:
                rt.handler = load_handler(rt.spec, reload=True)
            except Exception as exc:
                log.error("SIGHUP: keeping the loaded handler of %s: %s", rt.spec.name, exc)
                continue
            for child in rt.children:
                child.respawn_now = True
                self._stop_child(child)
        event(log, "reload", "SIGHUP: rolling every consumer process")

    def _stop_child(self, child: Child) -> None:
        if child.stop_sent:
            return
        child.stop_sent = True
        child.state = "stopping"
        child.send(protocol.STOP)
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    # --- children ---------------------------------------------------------------------

    def _spawn(self, rt: QueueRuntime, slot: Slot) -> None:
        # no SQLite transaction of the scheduler's may be open across the fork: the child
        # would inherit its lock as held, and its own floor writes would wait in vain
        if self.floor is not None and not self.floor.pause_for_fork():
            slot.respawn_at = time.monotonic() + FORK_RETRY_S
            return
        forget = [*self.forget_in_child, self._sibling_forgetter()]
        try:
            child = fork_child(rt.spec.name, slot.index, self.settings.redis_url, rt.settings,
                               rt.handler, self.settings.max_jobs, forget,
                               self.settings.floor_url)
        finally:
            if self.floor is not None:
                self.floor.resume_after_fork()
        slot.child = child
        slot.respawn_at = None
        self.pids[child.pid] = child
        rt.children_by_fd[child.sock.fileno()] = child
        self.selector.register(child.sock.fileno(), selectors.EVENT_READ, child)
        event(log, "spawn", "queue %s: consumer %d started", rt.spec.name, child.pid,
              queue=rt.spec.name, pid=child.pid)

    def _sibling_forgetter(self) -> Callable[[], None]:
        """Drop the pipe ends of every child alive now (so a dead child's EOF arrives), and
        the view of their shared tables."""
        socks = [c.sock for c in self.pids.values()]
        tables = [c.holdings for c in self.pids.values()]

        def forget() -> None:
            for sock in socks:
                sever(sock)
            for table in tables:
                table.close()

        return forget

    def _on_child_readable(self, child: Child) -> None:
        self._consume_lines(child)
        if child.reader.closed:
            self._unregister_child(child)
            self._reap_children()

    def _consume_lines(self, child: Child) -> None:
        rt = self.queues[child.queue]
        for line in child.reader.read():
            if line.startswith(protocol.OBS):
                self.observed.merge(child.queue, line)
            elif line.startswith(protocol.IDLE):
                parts = line.split()
                jobs = int(parts[1]) if len(parts) > 1 else 0
                rt.claim_jobs += jobs
                rt.claim_wait_us += int(parts[2]) if len(parts) > 2 else 0
                child.jobs += jobs
                if child.state == "busy":
                    child.state = "idle"
                if jobs:
                    self._slot_of(child).crashes = 0
                # told while a promote was on its way: its claim may have reached the
                # server before the promote (whose ring it stood in for). Its count does
                # not tell (a concurrent child counts jobs claimed before or beside that
                # claim), so it claims once more: an empty claim at worst
                missed = child.told_ahead
                child.told_ahead = False
                if child.state == "idle" and (rt.work_seen >= child.poked_at or missed) \
                        and not self.stopping:
                    self._poke(rt, child)  # work may have come after its last claim
            elif line.startswith((protocol.REFUSED, protocol.BOOTFAIL)):
                self._on_child_trouble(rt, child, line)
            elif line == protocol.READY and child.state == "starting":
                child.state = "idle"
                if not self.stopping:
                    self._poke(rt, child)

    def _unregister_child(self, child: Child) -> None:
        fd = child.sock.fileno()
        if fd >= 0:
            try:
                self.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
            self.queues[child.queue].children_by_fd.pop(fd, None)

    def _reap_children(self) -> None:
        """waitpid until nothing is left to reap; unknown children are reaped too (PID 1)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                return
            child = self.pids.pop(pid, None)
            if child is not None:
                self._on_child_exit(child, status)

    def _on_child_exit(self, child: Child, status: int) -> None:
        rt = self.queues[child.queue]
        slot = self._slot_of(child)
        # SIGCHLD can be read before the child's last lines. One read takes all a dead
        # child left (a few short lines); no loop, in case a grandchild still holds the
        # other end open.
        if not child.reader.closed:
            self._consume_lines(child)
        self._unregister_child(child)
        child.sock.close()
        slot.child = None
        settled_some = child.holdings.dropped() > 0  # got work done: not a crash loop
        released, stalled, landed = self._release_child(rt, child)
        # a settle written behind a claim lands before its reply is read: the child died
        # with the reply unread, but the server recorded those outcomes
        settled_some = settled_some or landed > 0
        if child.state == "busy" and not released:
            # it was told to claim and left without saying it found nothing (a recycle, a
            # crash): the work it was woken for goes to a sibling (releases poke on their own)
            rt.work_seen = time.monotonic()
            if self._poke_idle(rt) is None and child.told_ahead:
                # no sibling here (or stopping) and the promote it stood for rang nothing:
                # ring now, for the consumers of other replicas
                self._ring(rt)
        if os.WIFSIGNALED(status):
            how, code = f"killed by {signal.Signals(os.WTERMSIG(status)).name}", -1
        else:
            code = os.WEXITSTATUS(status)
            how = f"exited with {code}"
        if child.boot_failure is not None:  # its word, not its exit code: a handler may exit 3
            raise BootFailed(f"queue {child.queue}: consumer could not start "
                             f"({child.boot_failure}); stopping")
        crashed = not (code in (protocol.EXIT_OK, protocol.EXIT_RECYCLE) or child.respawn_now)
        level = logging.WARNING if crashed and not self.stopping else logging.INFO
        event(log, "child-exit", "queue %s: consumer %d %s%s", child.queue, child.pid, how,
              f", released {released} job(s)" if released else "", level=level,
              queue=child.queue, pid=child.pid, exit=code, stalled=stalled)
        if self.stopping:
            return
        now = time.monotonic()
        rt.restarts += 1
        if crashed:
            if now - child.started_at > STABLE_AFTER_S or settled_some:
                slot.crashes = 0  # it lived long, or settled a batch: not a crash loop
            slot.crashes += 1
            delay = 0.0 if slot.crashes == 1 else min(
                CRASH_BACKOFF_MAX_S, 0.25 * 2 ** (slot.crashes - 2))
        else:
            delay = 0.0
        slot.respawn_at = now + delay
        if delay:
            event(log, "backoff", "queue %s: slot %d crashed %d times in a row; respawn in "
                  "%.2fs", child.queue, slot.index, slot.crashes, delay,
                  queue=child.queue, delay_s=delay, count=slot.crashes)

    def _release_child(self, rt: QueueRuntime, child: Child, drained: bool = False
                       ) -> tuple[int, list[str], int]:
        """Hand back every job a dead child held, each charged for what it was doing;
        jobs killed for their time limit fail instead. ``drained``: the supervisor ended
        it at the drain deadline, so every running job ran past it and counts a stall.
        Returns how many were held, the ids of those charged a stall, and how many matched
        no token: no longer the child's (a settle it wrote landed, its reply unread; or,
        rarely, a hand-back or a reap did)."""
        held = child.holdings.entries()
        child.holdings.close()
        self._release_unheld(rt, child, {h.pair for h in held})
        timed_out = [h for h in held if h.job_id in child.timed_out]
        rest = [h for h in held if h.job_id not in child.timed_out]
        if timed_out:
            self._fail_timed_out(rt, child, timed_out)
        running = sum(1 for h in rest if h.state == RUNNING)
        modes = UNCHARGED if child.timed_out else (
            SUSPECT_MODES if running > 1 and not drained else RELEASE_MODES)
        landed = 0
        for mode, run in runs_by_mode(rest, modes):
            counts = self._release(rt, [h.pair for h in run], mode)
            if counts is not None:
                landed += len(run) - sum(counts)
        return len(held), [h.job_id for h in rest if modes[h.state] == "stall"], landed

    def _release_unheld(self, rt: QueueRuntime, child: Child, held: set[tuple[str, str]]
                        ) -> None:
        """Hand back, uncharged, the jobs the child's claims leased that it never held (it
        died before it read a claim's reply): its claims' record names them. Jobs it
        settled or handed back meanwhile no longer match their tokens and stay as they are.
        Released before the held ones, which go in front of them."""
        if child.claimer:
            self._release_claims(rt, child.claimer, held)

    def _release_claims(self, rt: QueueRuntime, claimer: str, held: set[tuple[str, str]]
                        ) -> bool:
        """Read a dead consumer's claims record, hand back what it did not hold, and only
        then drop the record: a read whose reply was lost (the server ran it) is read
        again, and a release that ran twice matches no token the second time."""
        key = rt.metronome.keys.claims(claimer)
        try:
            raw = self.client.lrange(key, 0, -1)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("queue %s: could not read a dead consumer's claims (%s); kept until "
                        "the server answers", rt.spec.name, exc)
            rt.unreleased.append(("claims", claimer, held))
            return False
        unheld = unheld_claims(raw, held)
        if unheld and self._release(rt, unheld, "unstarted", quiet=True) is None:
            return False  # kept as jobs: their leases are extended until it answers
        try:
            self.client.delete(key)
        except UNAVAILABLE_ERRORS:
            pass  # nobody appends to it any more: it expires ten leases after its last claim
        return True

    def _retry_releases(self, rt: QueueRuntime) -> None:
        """Hand back what a dead child held, kept while the server could not take it."""
        pending, rt.unreleased = rt.unreleased, []
        for i, (kind, what, detail) in enumerate(pending):
            done = (self._release_claims(rt, what, detail) if kind == "claims"
                    else self._release(rt, what, detail) is not None)
            if not done:  # kept again (appended): keep the rest too, in their order
                rt.unreleased.extend(pending[i + 1:])
                return

    def _fail_timed_out(self, rt: QueueRuntime, child: Child, held: list[Held]) -> None:
        """Settle jobs whose process was ended at their time limit as failed attempts."""
        lanes = Lanes(self.client, rt.metronome.keys, rt.settings)
        try:
            outcomes = []
            for h in held:
                attempts, backoff = self.client.hmget(rt.metronome.keys.job(h.job_id),
                                                      "attempts", "backoff")
                retry_ms = retry_ms_of(rt.settings, int(attempts or 1),
                                       (backoff or b"").decode())
                text = (f"{timed_out_text(child.timed_out[h.job_id])}: the supervisor ended "
                        f"process {child.pid}")
                outcomes.append(Outcome(h.job_id, h.token, "f", text, retry_ms))
            lanes.settle(outcomes)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("queue %s: could not fail %d timed-out job(s) (%s); their leases will "
                        "expire", rt.spec.name, len(held), exc)

    def _release(self, rt: QueueRuntime, held: list[tuple[str, str]], mode: str,
                 quiet: bool = False) -> tuple[int, int] | None:
        """Hand jobs back (reap.lua's modes); ``quiet``: say nothing when none went back.
        Returns (requeued, buried); None when the server could not take them: kept, and
        retried when it answers."""
        try:
            requeued, buried = scripts.release(self.client, rt.metronome.keys, held, mode)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("queue %s: could not release %d job(s) (%s); kept until the server "
                        "answers", rt.spec.name, len(held), exc)
            rt.unreleased.append(("jobs", held, mode))
            return None
        if requeued:
            rt.work_seen = time.monotonic()
            self._poke_idle(rt)
        if not (quiet and not requeued + buried):
            event(log, "release", "queue %s: requeued %d, buried %d (mode %s)", rt.spec.name,
                  requeued, buried, mode, queue=rt.spec.name, count=requeued + buried)
        return requeued, buried

    def _slot_of(self, child: Child) -> Slot:
        return self.queues[child.queue].slots[child.slot]

    def _kill_all(self) -> None:
        """The end of the drain ladder: SIGKILL what remains, reap it, requeue its jobs."""
        self.stopping = True
        for child in list(self.pids.values()):
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid, child in list(self.pids.items()):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass  # already reaped
            self.pids.pop(pid, None)
            self._unregister_child(child)
            slot = self._slot_of(child)
            slot.child = None
            if not child.reader.closed:
                self._consume_lines(child)
            self._release_child(self.queues[child.queue], child, drained=True)
            child.sock.close()

    # --- the beat ------------------------------------------------------------------------

    def _poke(self, rt: QueueRuntime, child: Child) -> bool:
        """Tell an idle child to claim; False when it could not be told (a full or closed
        pipe: the child is busy or gone)."""
        if not rt.healthy:
            return False  # it could not settle or claim; every idle child is poked on recovery
        if child.send(protocol.POKE):
            child.state = "busy"
            child.poked_at = time.monotonic()
            return True
        return False

    def _poke_idle(self, rt: QueueRuntime) -> Child | None:
        """Poke one idle child: its first claim rings again while work remains, and the
        next ring pokes the next child, so one job wakes one process and a burst all. A
        child that cannot be told (it died idle, its exit not yet read) passes the poke to
        the next one. Returns the child poked, None when none could be."""
        if self.stopping:
            return None
        for child in sorted((c for c in rt.children if c.state == "idle"),
                            key=lambda c: c.poked_at):
            if self._poke(rt, child):
                return child
        return None

    def _on_ring(self, rt: QueueRuntime) -> None:
        now = time.monotonic()
        try:
            rung = rt.metronome.collect_ring()
        except UNAVAILABLE_ERRORS as exc:
            self._unregister_doorbell(rt)
            self._queue_down(rt, now, exc)
            return
        if rung:
            self._found_work(rt, now)  # poke first: promote can wait a few microseconds

    def _ring(self, rt: QueueRuntime) -> None:
        """Ring the queue's doorbell (a quiet promote whose told child left unheard)."""
        try:
            ring(self.client, rt.metronome.keys, rt.settings.doorbell)
        except UNAVAILABLE_ERRORS as exc:  # every idle child is poked when it comes back
            self._queue_down(rt, time.monotonic(), exc)

    def _found_work(self, rt: QueueRuntime, now: float) -> None:
        rt.work_seen = now
        rt.metronome.saw_work(now)
        self._poke_idle(rt)

    def _arm_doorbells(self, now: float) -> None:
        """Keep each queue's BLPOP outstanding while any of its children could take work."""
        if self.stopping:
            return
        for rt in self.queues.values():
            # a reply already in the socket (it came after the selector's last look) is
            # read here; the call it ends is then sent again, so the loop never blocks
            # with a child idle and nothing parked
            while self._arm_doorbell(rt, now):
                self._on_ring(rt)

    def _arm_doorbell(self, rt: QueueRuntime, now: float) -> bool:
        """Arm one queue's doorbell if it should be; True when its reply is already here."""
        bell = rt.metronome.doorbell
        if not rt.healthy and now < rt.metronome.deadline():
            return False
        anyone_idle = any(c.state in ("idle", "starting") for c in rt.children)
        if not anyone_idle or not rt.healthy:
            return False
        if bell.overdue() and not bell.buffered():
            # no reply long past the block: the connection died without a word (a host
            # gone, a partition); nothing would ever make its socket readable
            event(log, "doorbell-overdue", "queue %s: no reply on the doorbell for %.1fs; "
                  "reconnecting", rt.spec.name, time.monotonic() - (bell.armed_at or 0.0),
                  level=logging.WARNING, queue=rt.spec.name)
            self._unregister_doorbell(rt)
            bell.reset()
            bell.lost = True
        try:
            bell.arm()
            fd = bell.fileno()
            # a close that came after the last select shows here, not in the selector
            buffered = bell.buffered()
        except UNAVAILABLE_ERRORS as exc:
            self._unregister_doorbell(rt)
            self._queue_down(rt, now, exc)
            return False
        if rt.metronome.registered_fd != fd:
            self._unregister_doorbell(rt)
            self.selector.register(fd, selectors.EVENT_READ, rt)
            rt.metronome.registered_fd = fd
        return buffered

    def _unregister_doorbell(self, rt: QueueRuntime) -> None:
        fd = rt.metronome.registered_fd
        if fd is not None:
            try:
                self.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
            rt.metronome.registered_fd = None

    def _forget_doorbell(self, rt: QueueRuntime) -> None:
        sever(getattr(rt.metronome.doorbell.conn, "_sock", None))
        rt.metronome.doorbell.conn._sock = None

    def _queue_down(self, rt: QueueRuntime, now: float, exc: BaseException | None = None,
                    *, code: str | None = None, detail: str = "") -> None:
        """The server is unreachable or refuses writes: wait, then probe (see outage.py)."""
        self._unregister_doorbell(rt)  # its socket closes now: its fd may be reused at once
        rt.metronome.doorbell.reset()
        rt.metronome.retry_later(now, rt.availability.down(exc, code=code, detail=detail))

    def _queue_up(self, rt: QueueRuntime, now: float) -> None:
        """The probe succeeded after an outage: fork the slots that waited for the server
        (no crash backoff earned meanwhile delays them) and poke every idle child, since
        each may hold outcomes it could not settle. Leases in hand are extended at once and
        the reap waits a beat: leases that ran out during the outage belong to jobs that
        are running or settling now, not to dead processes."""
        self._retry_releases(rt)
        for slot in rt.slots:
            if slot.child is None and slot.respawn_at is not None:
                slot.respawn_at = min(slot.respawn_at, now)
        for child in rt.children:
            if child.state == "idle":
                self._poke(rt, child)
        self.next_extend = now
        rt.metronome.retry_later(now, rt.metronome.beat_s)

    def _on_child_trouble(self, rt: QueueRuntime, child: Child, line: str) -> None:
        """A child's REFUSED (the server refused its write) or BOOTFAIL (it cannot start)."""
        word, _, rest = line.partition(" ")
        if word == protocol.BOOTFAIL:
            child.boot_failure = rest or "no reason given"
            return
        code, _, text = rest.partition(" ")
        if rt.healthy or rt.availability.code != code:
            self._queue_down(rt, time.monotonic(), code=code or "ERR", detail=text)

    def _on_timers(self, now: float) -> None:
        if self.drain_deadline is not None and now >= self.drain_deadline and self.pids:
            event(log, "drain-timeout", "drain timeout: killing %d consumer(s), requeueing "
                  "their jobs", len(self.pids), count=len(self.pids))
            self._kill_all()
            return
        self._enforce_time_limits(now)
        if now >= self.next_extend:  # also while draining: running jobs keep their leases
            self._extend_leases()
            self.next_extend = now + self.settings.lease_ms / 3000
        if self.stopping:
            return
        for rt in self.queues.values():
            for slot in rt.slots:
                # forked only while the server answers: a child needs it to do anything
                if slot.child is None and slot.respawn_at is not None and \
                        now >= slot.respawn_at and rt.healthy:
                    self._spawn(rt, slot)
            self._pump(rt, now)
            if rt.scheduler is not None and now >= rt.scheduler.deadline():
                try:
                    rt.scheduler.tick(now)
                except UNAVAILABLE_ERRORS as exc:  # a refusal: the scheduler waits like the rest
                    self._queue_down(rt, now, exc)
        if self.settings.max_memory_mb and now >= self.next_recycle:
            self._recycle_over_memory()
            self.next_recycle = now + RECYCLE_CHECK_S

    def _pump(self, rt: QueueRuntime, now: float) -> None:
        if now < rt.metronome.deadline():
            return
        told: Child | None = None  # poked while the promote was on its way
        try:
            if not rt.healthy:
                self._declare_queue(rt)  # the probe: a write, refused while writes are
                found = False
            else:
                if rt.unreleased:  # before a reap could charge their leases a stall
                    self._retry_releases(rt)
                parked = any(c.state in ("idle", "starting") for c in rt.children)

                def tell() -> bool:
                    nonlocal told
                    told = self._poke_idle(rt)
                    return told is not None

                # a schedule head fell due: a child is told once the promote is written,
                # so its claim follows the promote instead of waiting for its reply
                found = rt.metronome.pump(now, disarmed=not parked,
                                          tell=tell if rt.metronome.head_due(now) else None)
        except UNAVAILABLE_ERRORS as exc:
            self._queue_down(rt, now, exc)
            return
        if rt.availability.up():
            self._queue_up(rt, now)
            rt.work_seen = now  # work may have piled up while we could not see it
            return
        if found and told is not None:
            told.told_ahead = True  # see the IDLE it sends
            rt.work_seen = now
            rt.metronome.saw_work(now)
        elif found:
            self._found_work(rt, now)

    def _enforce_time_limits(self, now: float) -> None:
        """End a child whose running job passed its time limit (a sync handler cannot be
        interrupted inside its process); its slot respawns at once."""
        for rt in self.queues.values():
            for child in rt.children:
                deadline = child.holdings.deadline()
                if not deadline or deadline > now or child.timed_out:
                    continue
                late = [h for h in child.holdings.entries()
                        if h.state == RUNNING and h.deadline and h.deadline <= now]
                if not late:
                    continue
                child.timed_out = {h.job_id: h.timeout for h in late}
                child.respawn_now = True
                event(log, "timeout", "queue %s: consumer %d ran job %s past its limit of "
                      "%gs; ending it", rt.spec.name, child.pid, late[0].job_id,
                      late[0].timeout, level=logging.WARNING, queue=rt.spec.name,
                      pid=child.pid)
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _extend_leases(self) -> None:
        """Extend every lease a live child has: what its holdings list, and what its claims
        record names beyond them (a claim sent ahead is leased before the child reads its
        reply and holds it, which a long job before it can delay past a lease). Pairs the
        child settled or handed back meanwhile match no token and are left as they are."""
        for rt in self.queues.values():
            try:
                held = []
                for child in rt.children:
                    entries = child.holdings.entries()
                    held += [h.pair for h in entries]
                    # an idle child read every reply before it said so: nothing to read then
                    # (an idle supervisor sends nothing here); the record is renewed, so it
                    # outlives a job longer than its expiry
                    if child.claimer and (entries or child.state != "idle"):
                        key = rt.metronome.keys.claims(child.claimer)
                        pipe = self.client.pipeline(transaction=False)
                        pipe.lrange(key, 0, -1)
                        pipe.pexpire(key, 10 * rt.settings.lease_ms)
                        raw, _ = pipe.execute()
                        held += unheld_claims(raw, {h.pair for h in entries})
                held += [pair for kind, pairs, _ in rt.unreleased if kind == "jobs"
                         for pair in pairs]
                if held:
                    scripts.extend(self.client, rt.metronome.keys, rt.settings.lease_ms, held)
            except UNAVAILABLE_ERRORS as exc:
                log.warning("queue %s: lease extension failed: %s", rt.spec.name, exc)

    def _recycle_over_memory(self) -> None:
        limit = self.settings.max_memory_mb
        if not limit:
            return
        for rt in self.queues.values():
            for child in rt.children:
                if not child.stop_sent and over_memory(child.pid, limit):
                    event(log, "recycle", "queue %s: consumer %d over %d MiB; recycling after "
                          "its job", rt.spec.name, child.pid, limit, queue=rt.spec.name,
                          pid=child.pid)
                    child.respawn_now = True
                    self._stop_child(child)

    # --- health ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """A consistent-enough view for /readyz and /metrics (read from another thread)."""
        queues = {}
        for name, rt in self.queues.items():
            children = rt.children
            queues[name] = {
                "healthy": rt.healthy,
                "valkey": rt.availability.describe(),
                "refusals": dict(rt.availability.refusals),
                "children": len(children),
                "ready_children": sum(1 for c in children if c.state != "starting"),
                "processes": rt.spec.processes,
                "busy": sum(1 for c in children if c.state == "busy"),
                "restarts": rt.restarts,
                "claim_jobs": rt.claim_jobs,
                "claim_wait_us": rt.claim_wait_us,
                "rings": rt.metronome.rings,
                "promoted": rt.metronome.promoted,
                "reaped": rt.metronome.reaped,
                "dead_trimmed": rt.metronome.dead_trimmed,
                "pids": [c.pid for c in children],
                "scheduler": rt.scheduler.snapshot() if rt.scheduler is not None else None,
            }
        return {"stopping": self.stopping, "last_loop": self.last_loop, "queues": queues}
