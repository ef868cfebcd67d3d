"""The arbiter: one selector loop over signals, child pipes and the queues' doorbells,
and the wiring of the roles it delegates to.

Signal handlers only record (:mod:`signals` writes each number to a socket the loop
reads); the loop acts. Nothing here sleeps: the loop blocks in ``selector.select`` with
a timeout equal to the nearest local deadline (a schedule head, a lease head, a lease
extension, a respawn, the drain deadline) and acts on whatever woke it, through:

- :class:`~children.Children`: spawn, hear, reap and stop the consumer processes;
- :class:`~release.Releases`: hand back a dead child's jobs, each charged for its part;
- :class:`~doorbells.Doorbells`: arm each queue's doorbell, read its rings, poke;
- :class:`~leases.Leases`: extend leases, enforce time limits, recycle over memory.

The arbiter itself owns the signals' meaning (drain, abort, roll), each queue's beat
(reap and promote, the scheduler's tick), the server's availability per queue (down,
probe, up) and the snapshot read by /readyz and /metrics.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any

from echomq.supervisor import protocol
from echomq.supervisor.children import BootFailed, Child, Children, Slot, sever_client
from echomq.supervisor.doorbells import Doorbells
from echomq.supervisor.expirypass import ExpiryPasses
from echomq.supervisor.handlers import load_handler
from echomq.supervisor.leases import Leases
from echomq.supervisor.logs import event
from echomq.supervisor.metronome import Metronome
from echomq.supervisor.observations import Tally
from echomq.supervisor.outage import Availability
from echomq.supervisor.release import Releases
from echomq.supervisor.runtime import QueueRuntime
from echomq.supervisor.settings import Settings
from echomq.supervisor.signals import SignalPipe
from echomq.supervisor.stops import SELECTOR_TAG as STOPS
from echomq.supervisor.stops import Stops

from echomq import protocol as wire
from echomq import scripts
from echomq.config import QueueSettings
from echomq.connection import UNAVAILABLE_ERRORS, client_from_url, redact_url
from echomq.errors import ProtocolMismatch
from echomq.keys import REGISTRY, Keys
from echomq.lanes import record_lane_limit
from echomq.middleware import import_middleware
from echomq.reapgrace import held_until
from echomq.wake import DoorbellMismatch, claim_doorbell

log = logging.getLogger("echomq.supervisor")
EXIT_DOORBELL = 2  # the queue's doorbell was switched to the other kind (as cli's EXIT_USAGE)


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
        # imported here (a bad MODULE:NAME stops start), built in each forked consumer
        self.middleware = [import_middleware(m) for m in settings.middleware]
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
        # what start-up made (imports, the floor's migration check, the handlers) lives
        # as long as the process: out of the collector's reach, a full collection no
        # longer walks it, holding the GIL (and the scheduler's beat) for 70-150 ms a
        # time. Its garbage goes first (a frozen cycle holding a connection would never
        # close it), and both before the scheduler threads start
        gc.collect()
        gc.freeze()
        if scheduler_factory is not None:
            for rt in self.queues.values():
                rt.scheduler = scheduler_factory(rt)
        self.selector = selectors.DefaultSelector()
        self.signals: SignalPipe | None = None
        self.stopping = False
        self.drain_deadline: float | None = None
        self.last_loop = time.monotonic()
        self.started = time.time()
        self.exit_code = 0
        self.forget_in_child: list[Callable[[], None]] = []
        self.observed = Tally()  # the children's job observations, for /metrics
        # the roles the loop delegates to (each reads the shared state above)
        self.children = Children(self)
        self.releases = Releases(self)
        self.doorbells = Doorbells(self)
        self.leases = Leases(self)
        self.stops = Stops(self)
        self.expiry = ExpiryPasses(self)

    # --- lifecycle -------------------------------------------------------------------

    def run(self) -> int:
        """Run until a stop signal and the drain end; returns the exit code."""
        self.signals = SignalPipe()
        self.selector.register(self.signals.fileno(), selectors.EVENT_READ, "signals")
        self.forget_in_child.append(self.signals.forget_in_child)
        self.forget_in_child.append(lambda: sever_client(self.client))
        self.forget_in_child.append(self.stops.forget_in_child)
        if self.floor is not None:
            self.forget_in_child.append(self.floor.forget_after_fork)
        for rt in self.queues.values():
            self.forget_in_child.append(lambda rt=rt: self.doorbells.forget_in_child(rt))
            self._prepare_queue(rt, at_start=True)
        event(log, "start", "supervisor started: %s, queues %s", self.where,
              ", ".join(f"{q}×{rt.spec.processes}" for q, rt in self.queues.items()),
              pid=os.getpid())
        try:
            while True:
                self._loop_once()
                if self.stopping and not self.children.pids:
                    break
            for rt in self.queues.values():  # a last try: what stays leased will be reaped
                if rt.unreleased:
                    self.releases.retry(rt)
        except BootFailed as exc:
            log.error("%s", exc)
            self._halt()
            self.exit_code = protocol.EXIT_BOOT_FAILED
        finally:
            self.stops.drop()
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
        except (DoorbellMismatch, ProtocolMismatch) as exc:
            if at_start:
                raise
            # switched while this supervisor could not reach Valkey: its parked call would
            # never be rung again (or the queue now records another major protocol version)
            log.error("%s", exc)
            self.exit_code = EXIT_DOORBELL
            self._begin_drain()
        except UNAVAILABLE_ERRORS as exc:
            self.queue_down(rt, time.monotonic(), exc)

    def _declare_queue(self, rt: QueueRuntime) -> None:
        """Load the scripts and write the queue's meta: a write, so it is also the probe
        that tells a server refusing writes from one taking them again."""
        scripts.load_all(self.client, Keys(rt.spec.name).prefix)
        wire.claim(self.client, Keys(rt.spec.name))  # ProtocolMismatch: another major
        durability = rt.settings.durability or "volatile"
        # "fold" is the scheduler's lease (lead.lua), not set here
        self.client.hset(Keys(rt.spec.name).meta, mapping={"durability": durability})
        self.client.sadd(REGISTRY, rt.spec.name)  # `echomq queues` lists it
        claim_doorbell(self.client, rt.metronome.keys, rt.settings.doorbell,
                       switch=self.settings.switch_doorbell)
        if rt.settings.lane_limit is not None:
            record_lane_limit(self.client, rt.metronome.keys, rt.settings.lane_limit)

    def _loop_once(self) -> None:
        """Arm the doorbells, wait for the first event or deadline, act on what came."""
        now = time.monotonic()
        self.last_loop = now
        self.doorbells.arm_all(now)
        self.stops.arm()
        deadline = self._next_deadline()
        events = self.selector.select(whole_ms(deadline - time.monotonic()))
        if not events:
            _sleep_until(deadline)
        for key, _ in events:
            if key.data == "signals":
                assert self.signals is not None
                for signum in self.signals.read():
                    self._on_signal(signum)
            elif key.data == STOPS:
                self.stops.on_readable()
            elif isinstance(key.data, Child):
                self.children.on_readable(key.data)
            elif isinstance(key.data, QueueRuntime):
                self.doorbells.on_ring(key.data)
        self._on_timers(time.monotonic())

    def _next_deadline(self) -> float:
        deadlines = [time.monotonic() + 5.0]
        if not self.stopping:
            deadlines += [rt.metronome.deadline() for rt in self.queues.values()]
            deadlines += [s.respawn_at for rt in self.queues.values() for s in rt.slots
                          if s.respawn_at is not None and s.child is None and rt.healthy]
            deadlines += [rt.scheduler.deadline() for rt in self.queues.values()
                          if rt.scheduler is not None]
            deadlines += self.expiry.deadlines()
            deadlines += [d for rt in self.queues.values()
                          if (d := self.doorbells.holder_deadline(rt)) is not None]
        deadlines += self.leases.deadlines()
        if self.drain_deadline is not None:
            deadlines.append(self.drain_deadline)
        return min(deadlines)

    # --- signals ---------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        """Act on a recorded signal: ``handle_<name>`` (SIGUSR1 only wakes the loop)."""
        handle = getattr(self, f"handle_{signal.Signals(signum).name[3:].lower()}", None)
        if handle is not None:
            handle()

    def handle_chld(self) -> None:
        """SIGCHLD: reap every child that exited."""
        self.children.reap()

    def handle_term(self) -> None:
        """SIGTERM: drain (a second one changes nothing)."""
        self._stop_signal(signal.SIGTERM)

    def handle_int(self) -> None:
        """SIGINT: drain; a second SIGINT jumps to the end of the ladder."""
        self._stop_signal(signal.SIGINT)

    def handle_hup(self) -> None:
        """SIGHUP: reload the handlers and roll every consumer."""
        if not self.stopping:
            self._roll()

    def _stop_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stopping and signum == signal.SIGINT:
            event(log, "drain-abort", "second SIGINT: stopping now, requeueing jobs",
                  signal=name)
            self._halt()
        elif not self.stopping:
            self._begin_drain()
            # said once every child has its STOP: whatever a child does after the line,
            # it does stopping (no buffered or newly claimed job starts)
            event(log, "drain", "%s: draining (up to %.1fs)", name,
                  self.settings.drain_timeout, signal=name)

    def _begin_drain(self) -> None:
        """The first rung of the ladder: stop arming and poking, tell every child to stop."""
        self.stopping = True
        self.drain_deadline = time.monotonic() + self.settings.drain_timeout
        for rt in self.queues.values():
            self.doorbells.unregister(rt)
            rt.metronome.doorbell.cancel()
            for child in rt.children:
                self.children.stop(child)

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
                self.children.stop(child)
        event(log, "reload", "SIGHUP: rolling every consumer process")

    def _halt(self) -> None:
        """The end of the drain ladder: SIGKILL what remains, reap it, requeue its jobs."""
        self.stopping = True
        self.children.kill_all()

    def queue_down(self, rt: QueueRuntime, now: float, exc: BaseException | None = None,
                   *, code: str | None = None, detail: str = "") -> None:
        """The server is unreachable or refuses writes: wait, then probe (see outage.py)."""
        self.doorbells.unregister(rt)  # its socket closes now: its fd may be reused at once
        rt.metronome.doorbell.reset()
        rt.metronome.retry_later(now, rt.availability.down(exc, code=code, detail=detail))

    def _queue_up(self, rt: QueueRuntime, now: float) -> None:
        """The probe succeeded after an outage: fork the slots that waited for the server
        (no crash backoff earned meanwhile delays them) and poke every idle child, since
        each may hold outcomes it could not settle. Leases in hand are extended at once;
        after an outage of a third of a lease or more the reap waits a lease period: leases
        that ran out meanwhile belong to jobs that are running or settling now, not to dead
        processes, and a standalone consumer extends its own within a third of a lease of
        its return (echomq/reapgrace.py; a shorter blip holds nothing)."""
        self.releases.retry(rt)
        for slot in rt.slots:
            if slot.child is None and slot.respawn_at is not None:
                slot.respawn_at = min(slot.respawn_at, now)
        for child in rt.children:
            if child.state == "idle":
                self.doorbells.poke(rt, child)
        self.leases.next_extend = now
        rt.metronome.retry_later(now, rt.metronome.beat_s)
        rt.metronome.next_reap = max(rt.metronome.next_reap, held_until(
            rt.availability.since, now, rt.metronome.lease_s))

    def _on_timers(self, now: float) -> None:
        """Act on every deadline that passed: the drain's, the leases', respawns, the
        beats, the schedulers', the memory check."""
        pids = self.children.pids
        if self.drain_deadline is not None and now >= self.drain_deadline and pids:
            event(log, "drain-timeout", "drain timeout: killing %d consumer(s), requeueing "
                  "their jobs", len(pids), count=len(pids))
            self._halt()
            return
        self.leases.keep(now)
        if self.stopping:
            return
        self.children.end_stuck_boots(now)
        for rt in self.queues.values():
            for slot in rt.slots:
                # forked only while the server answers: a child needs it to do anything
                if slot.child is None and slot.respawn_at is not None and \
                        now >= slot.respawn_at and rt.healthy:
                    self.children.spawn(rt, slot)
            self._pump(rt, now)
            self.doorbells.watch_holder(rt, now)
            if rt.scheduler is not None and now >= rt.scheduler.deadline():
                try:
                    rt.scheduler.tick(now)
                except UNAVAILABLE_ERRORS as exc:  # a refusal: the scheduler waits like the rest
                    self.queue_down(rt, now, exc)
        self.expiry.on_timers(now)
        self.leases.recycle(now)

    def _pump(self, rt: QueueRuntime, now: float) -> None:
        """A queue's beat when due: reap and promote (or, while it is down, the probe)."""
        if now < rt.metronome.deadline():
            return
        told: Child | None = None  # poked while the promote was on its way
        try:
            if not rt.healthy:
                self._declare_queue(rt)  # the probe: a write, refused while writes are
                found = False
            else:
                if rt.unreleased:  # before a reap could charge their leases a stall
                    self.releases.retry(rt)
                parked = any(c.state in ("idle", "starting") for c in rt.children)

                def tell() -> bool:
                    nonlocal told
                    # not a child parked on the doorbell: the promote rings it, once written
                    told = self.doorbells.poke_idle(rt, ring_holder=False)
                    return told is not None

                # a schedule head fell due: a child is told once the promote is written,
                # so its claim follows the promote instead of waiting for its reply
                # (not when a child parked on the doorbell is the only one idle: the promote
                # rings it from the server, as soon as it runs)
                pokeable = any(c.state == "idle" and c is not rt.bell_holder
                               for c in rt.children)
                found = rt.metronome.pump(now, disarmed=not parked, tell=tell if (
                    pokeable and rt.metronome.head_due(now)) else None)
        except UNAVAILABLE_ERRORS as exc:
            self.queue_down(rt, now, exc)
            return
        if rt.availability.up():
            self._queue_up(rt, now)
            rt.work_seen = now  # work may have piled up while we could not see it
            return
        if found and told is not None:
            told.told_ahead = True  # see the IDLE it sends
            rt.work_seen = now
            rt.metronome.saw_work(now)
        elif found:  # promote and reap ring the doorbell when they make work claimable
            self.doorbells.found_work(rt, now, rang=True)

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
