"""The scheduler of one queue: the leader lease, the beat and the wiring of its passes.

One scheduler per queue is active across all replicas (a leader lease in Valkey
whose fencing token the floor checks). Each beat renews the lease (lead.lua) and,
while this replica leads, runs the queue's passes over the floor within a budget:
the fold of deferred and retried jobs onto the SQL floor and the closing of
finished ones (:mod:`echomq.supervisor.fold`), the spill of far-future jobs out of
Valkey and their restore as they come within the horizon
(:mod:`echomq.supervisor.spill`), the rehydration of the schedule set when Valkey
has lost its data (:mod:`echomq.supervisor.rehydrate`) and the orphan pass
(:mod:`echomq.supervisor.orphans`); what they share is
:mod:`echomq.supervisor.floorrows`. It also admits the queue's crons
(:mod:`echomq.supervisor.crontab`), waking for their next occurrence, and copies the
lane limits to the floor.

Every step is idempotent: a job id is a primary key on the floor and ``ZADD NX`` /
"hash exists" in Valkey. When the floor is down the queue keeps running on Valkey
alone, with the floor retried on a backoff; the fold log simply grows until the
floor answers again. A supervisor without a floor (or a queue whose dial is
volatile) runs a scheduler for crons alone, which leads only while the queue has
crons (it looks every ``CRON_PROBE_BEATS`` beats). :class:`SchedulerThread` runs a
scheduler off the arbiter's loop.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis
import redis.exceptions
from echomq.supervisor.crontab import CronTable
from echomq.supervisor.floorrows import _text, log
from echomq.supervisor.fold import Folding
from echomq.supervisor.logs import event
from echomq.supervisor.orphans import Orphans
from echomq.supervisor.rehydrate import REHYDRATING, Rehydrating
from echomq.supervisor.spill import Spilling

from echomq import scripts
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.errors import FloorError, StaleFence
from echomq.floor import Floor
from echomq.keys import Keys

TICK_BUDGET_S = 0.1  # floor work per tick; the rest continues on the next turn of the loop
FLOOR_BACKOFF_MAX_S = 30.0
DEFAULT_FOLD_GRACE_S = 300.0  # how long the logs keep growing after the last scheduler left
DEFAULT_MAX_BACKLOG = 1_000_000  # fold log entries kept while the floor is down
DEFAULT_ORPHAN_EVERY_S = 60.0  # a full pass over the floor's rows looking for orphans
CRON_PROBE_BEATS = 5  # a scheduler without a floor looks for crons this often
LATE_BEATS = 1.5  # a beat begun this many beats after the last one is reported late


class Scheduler(Folding, Spilling, Rehydrating, Orphans):
    """The floor side of one queue: ``tick`` when ``deadline`` (:class:`SchedulerThread`).
    The passes are the methods of its bases, one module each; the state they share is
    set here."""

    def __init__(self, queue: str, client: redis.Redis, floor: Floor | None, *, beat_ms: int,
                 horizon_s: float, clock_offset_ms: int = 0,
                 fold_grace_s: float = DEFAULT_FOLD_GRACE_S,
                 max_backlog: int = DEFAULT_MAX_BACKLOG,
                 orphan_every_s: float = DEFAULT_ORPHAN_EVERY_S) -> None:
        self.queue = queue
        self.keys = Keys(queue)
        self.client = client
        self.has_floor = floor is not None  # without one: crons alone
        self.floor = cast(Floor, floor)  # used only when has_floor
        self.beat_s = beat_ms / 1000
        self.horizon_ms = int(horizon_s * 1000)
        self.clock_offset_ms = clock_offset_ms  # tests and drills move the scheduler's clock
        self.replica = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_ms = max(3000, int(beat_ms * 5))
        # the fold lease outlives leader hand-overs (a leader lease or two) by far
        self.fold_grace_ms = max(int(fold_grace_s * 1000), 2 * self.lease_ms)
        self.max_backlog = max_backlog
        self.orphan_every_s = orphan_every_s
        self.next_orphan_check = 0.0
        self.orphan_after: str | None = None  # the orphan pass's place on the floor
        self.fence: int | None = None
        self.next_tick = 0.0
        self.next_restore = 0.0
        self.floor_retry_at = 0.0
        # after a lapse of the fold lease: folding the schedule set, then the jobs promoted
        # or released meanwhile (on the lanes, then leased), then the blocked ones, a batch
        # at a time
        self.sweep_offset: int | None = None  # a ZSCAN cursor, or a lane's distance from its tail
        self.sweep_phase = "schedule"
        self.sweep_lanes: list[str] = []
        self.sweep_ended = False  # told to the next lead call, which clears meta "sweep"
        self.budget_end = 0.0
        self.rehydration: str | None = None  # our in-progress epoch token
        self.rehydrate_after: tuple[int, str] | None = None
        self.rehydrate_count = 0
        self.rehydrate_phase = "rows"  # the walk over the floor, then "deps": the fan-in
        self.rehydrate_cursor = 0  # ZSCAN cursor over waitdeps in phase "deps"
        self.restore_every_s = max(self.beat_s, min(10 * self.beat_s, horizon_s / 4))
        self.floor_ok = True
        self.floor_error = ""
        self.floor_failures = 0
        self.folded = self.closed = self.spilled = self.restored = self.rehydrated = 0
        self.orphans_closed = self.buried = self.backlog_dropped = 0
        self.buried_open: list[str] = []  # buried jobs whose floor rows are still to close
        self.backlog = self.closed_backlog = 0
        # a hand-over (a leader died, another took the lease) is over within this
        catchup_ms = 2 * self.lease_ms + (CRON_PROBE_BEATS + 1) * beat_ms
        self.crontab = CronTable(queue, client, floor, catchup_ms)
        self.next_cron = math.inf  # monotonic time of the next cron occurrence
        self.cron_probe_at = 0.0
        self.cron_present = False
        self.limits_version: str | None = None  # the lane limits' version on the floor
        # a floor unreachable when the supervisor started had its schema checked by nobody
        self.schema_checked = False
        self.limits_restored = 0
        self.relay: Any = None  # an echomq.supervisor.relay.Relay when an outbox is served
        self.durable = False  # the "durable" dial: relayed jobs go onto the floor too

    # --- the arbiter's interface ---------------------------------------------------

    def deadline(self) -> float:
        """When the scheduler must next act: its beat or the next cron occurrence."""
        return min(self.next_tick, self.next_cron)

    def tick(self, now: float) -> None:
        """One beat of floor work; never raises for an unreachable Valkey or floor."""
        self.next_tick = now + self.beat_s
        try:
            self._tick(now, floor_work=now >= self.floor_retry_at)
            self.relay_outbox()
        except UNAVAILABLE_ERRORS as exc:
            log.debug("queue %s: scheduler skipped a beat: %s", self.queue, exc)
        except StaleFence:
            event(log, "scheduler-deposed", "queue %s: a newer scheduler leads; standing down",
                  self.queue, queue=self.queue)
            self.fence = None
        except FloorError as exc:
            self._floor_down(now, exc)
            self._relay_without_floor()
            return
        if not self.floor_ok:
            self.floor_ok = True
            self.floor_failures = 0
            event(log, "floor-up", "queue %s: floor reachable again; caught up", self.queue,
                  queue=self.queue)

    def _relay_without_floor(self) -> None:
        """The floor is down this beat: the outbox (in the application's database) is
        relayed all the same; under "durable" its floor write fails it, admitting nothing."""
        try:
            self.relay_outbox()
        except UNAVAILABLE_ERRORS as exc:
            log.debug("queue %s: outbox relay skipped a beat: %s", self.queue, exc)

    def relay_outbox(self) -> int:
        """Admit the queue's committed outbox rows, while this replica leads."""
        if self.relay is None or self.fence is None:
            return 0
        return int(self.relay.run(self.floor if self.has_floor else None, self.durable,
                                  leader=f"{self.replica}|{self.fence}"))

    def snapshot(self) -> dict[str, Any]:
        """Figures for /readyz and /metrics: floor state, leadership, folded, spilled, crons,
        and the outbox relay's state when it serves one."""
        outbox = {} if self.relay is None else {
            "outbox": "ok" if not self.relay.error else f"failing: {self.relay.error}",
            "relayed": self.relay.relayed}
        if not self.has_floor:  # crons alone
            return {"floor": "none", "leader": self.fence is not None,
                    "crons": len(self.crontab.specs), "cron_fired": self.crontab.fired,
                    **outbox}
        return {**outbox,
            "floor": "ok" if self.floor_ok else f"down: {self.floor_error}",
            "leader": self.fence is not None, "folded": self.folded, "closed": self.closed,
            "spilled": self.spilled, "restored": self.restored, "backlog": self.backlog,
            "rehydrated": self.rehydrated, "closed_backlog": self.closed_backlog,
            "orphans_closed": self.orphans_closed, "buried": self.buried,
            "backlog_dropped": self.backlog_dropped,
            "crons": len(self.crontab.specs), "cron_fired": self.crontab.fired,
        }

    def close(self, flush: bool = True) -> None:
        """Hand the leadership on at once, if this replica holds it; first (``flush``)
        write what the floor is owed since the last beat: the rows of jobs deferred, and
        the closes of jobs finished (a loss of Valkey's data before the next leader's beat
        would run those again). Bounded by one tick's budget."""
        if self.fence is not None and self.has_floor and flush and self.floor_ok:
            self.budget_end = time.monotonic() + TICK_BUDGET_S
            try:
                self._fold()
                self._close()
            except (*UNAVAILABLE_ERRORS, FloorError, StaleFence) as exc:
                log.info("queue %s: the floor's last writes before the hand-over failed "
                         "(the next leader makes them): %s", self.queue, exc)
        if self.fence is not None:
            try:  # hand leadership on at once instead of after the lease runs out
                held = self.client.get(self.keys.leader)
                if held and _text(held).startswith(self.replica + "|"):
                    self.client.delete(self.keys.leader)
            except UNAVAILABLE_ERRORS:
                pass

    # --- the beat -------------------------------------------------------------------

    def _tick(self, now: float, floor_work: bool = True) -> None:
        self.budget_end = time.monotonic() + TICK_BUDGET_S
        self.next_cron = math.inf
        if not self.has_floor and self.relay is None and not self._crons_present(now):
            self.fence = None  # nothing to lead: no floor, no outbox, no cron
            return
        (fence, fold_len, closed_len, epoch, spill_candidates, server_now, lapsed, led,
         cron_version, limits_version) = scripts.LEAD(
            self.client,
            [self.keys.leader, self.keys.fold, self.keys.closed, self.keys.epoch,
             self.keys.schedule, self.keys.meta],
            [self.replica, self.lease_ms, self.horizon_ms + self.clock_offset_ms,
             self.fold_grace_ms if self.has_floor else 0, "1" if self.sweep_ended else ""])
        self.sweep_ended = False
        fence = int(fence)
        self.backlog, self.closed_backlog = int(fold_len), int(closed_len)
        if fence < 0:
            self.fence = None
            return
        if self.fence != fence:
            event(log, "scheduler-lead", "queue %s: this replica now runs the scheduler",
                  self.queue, queue=self.queue)
            self.crontab.forget()
            self.limits_version = None
        self.fence = fence
        epoch = _text(epoch)
        if self.has_floor and floor_work and not self.schema_checked:
            # a schema behind this release (a migration not run) is a FloorSchemaError: the
            # floor counts as down, with the hint to migrate, until it is at the head
            self.floor.check_at_head()
            self.schema_checked = True
        if self.has_floor and floor_work and (
                not epoch or epoch.startswith(REHYDRATING) and epoch != self.rehydration):
            self.crontab.restore()  # Valkey lost its data: the crons come back first
        self._crons(now, int(server_now), _text(led), _text(cron_version))
        if not self.has_floor:
            return
        if int(lapsed):
            # jobs scheduled while nobody folded (no scheduler yet, or none for longer
            # than the fold lease) reach the floor by a sweep of the schedule set, the
            # lanes and the leases, in slices; a hand-over within the lease needs none,
            # unless the leader before left a sweep unfinished (meta "sweep": 2)
            self._start_sweep()
        if self.backlog + self.closed_backlog > self.max_backlog:
            self._drop_backlog()
            fold_len = closed_len = 0
        if not floor_work:  # the floor is backing off: the lease is renewed, nothing more
            return
        rehydrating = not epoch or epoch.startswith(REHYDRATING)
        if rehydrating and int(closed_len):
            # jobs finish while a rehydration takes its beats: their rows close at each
            # (one left open until it ended would run again at a loss in that time)
            self._close()
        if rehydrating and not self._rehydrate(int(server_now), epoch):
            return
        self.crontab.sync_floor(fence)
        version = _text(limits_version)  # "": no limit set since Valkey's data began
        if version and version != self.limits_version:
            self._copy_limits(fence, epoch)
        if int(fold_len):
            self._fold()
        if int(closed_len) and not self._over_budget():
            self._close()
        if int(spill_candidates) and not self._over_budget():
            self._spill(int(server_now))
        if now >= self.next_restore and not self._over_budget():
            self._restore_due(int(server_now))
            self.next_restore = now + self.restore_every_s
        while self.sweep_offset is not None and not self._over_budget():
            self._sweep()
        if now >= self.next_orphan_check and not self._over_budget():
            self._close_orphans(now, epoch)

    def _crons_present(self, now: float) -> bool:
        """Without a floor: whether the queue has crons (looked up every few beats)."""
        if self.crontab.specs:
            return True
        if now >= self.cron_probe_at:
            self.cron_probe_at = now + CRON_PROBE_BEATS * self.beat_s
            self.cron_present = bool(self.client.exists(self.keys.crons))
        return self.cron_present

    def _crons(self, now: float, server_now: int, led: str, version: str) -> None:
        """Admit due cron occurrences; the thread wakes for the next one."""
        self.crontab.tick(server_now, led, version)
        due = self.crontab.next_due_ms
        if due is not None:
            self.next_cron = now + max(0, due - server_now + 1) / 1000

    def _copy_limits(self, fence: int, epoch: str) -> None:
        """Copy Valkey's lane limits to the floor (they changed, or this replica just took
        the lead); nothing while Valkey holds another epoch's data, or none."""
        read = scripts.LIMITS_READ(self.client, [self.keys.epoch, self.keys.limits,
                                                 self.keys.meta], [epoch])
        if not read:  # Valkey lost its data since the lead call: the restore comes first
            return
        version, flat = _text(read[0]), [_text(x) for x in read[1]]
        self.floor.put_lane_limits(self.queue, dict(zip(flat[::2], flat[1::2], strict=True)), fence)
        self.limits_version = version

    def _floor_down(self, now: float, exc: Exception) -> None:
        self.floor_failures += 1
        delay = min(FLOOR_BACKOFF_MAX_S, self.beat_s * 2 ** min(self.floor_failures, 8))
        self.floor_retry_at = now + delay  # beats go on meanwhile, renewing the leader lease
        if self.floor_ok or self.floor_failures % 10 == 0:
            event(log, "floor-down", "queue %s: floor unavailable (%s); jobs stay in Valkey, "
                  "retrying in %.1fs", self.queue, exc, delay, level=logging.WARNING,
                  queue=self.queue, delay_s=delay)
        self.floor_ok = False
        self.floor_error = str(exc)[:200]


class SchedulerThread:
    """Runs one queue's :class:`Scheduler` on a thread of its own.

    The floor is a remote database: a lock held by someone else, a paused or
    partitioned server can make one call wait for as long as its timeouts allow.
    Off the arbiter's loop, such a wait delays only folding; signals, children,
    the metronome and ``/livez`` carry on. The arbiter's interface is kept:
    ``deadline`` is never due (the thread keeps its own), ``tick`` does nothing.
    """

    JOIN_S = 5.0  # close(): how long to let a beat in progress finish

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.queue = scheduler.queue
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by close() and by poke()
        self._poked = False
        self.beat_started: float | None = None  # monotonic start of the beat in progress
        self.last_beat: float | None = None  # monotonic start of the last beat
        self.late = 0  # beats reported late
        self._thread = threading.Thread(target=self._run, name=f"echomq-scheduler-{self.queue}",
                                        daemon=True)
        self._thread.start()

    def deadline(self) -> float:
        """Never due: the thread keeps its own deadline."""
        return math.inf

    def tick(self, now: float) -> None:
        """Nothing: the thread keeps the beat."""

    def snapshot(self) -> dict[str, Any]:
        """The scheduler's latest figures, safe to read from the arbiter's thread."""
        snap = self.scheduler.snapshot()
        started = self.beat_started
        snap["beat_running_s"] = round(time.monotonic() - started, 3) if started else 0.0
        snap["late_beats"] = self.late
        return snap

    def poke(self) -> None:
        """Relay the outbox now (a NOTIFY at an application's commit), not at the beat."""
        self._poked = True
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (waiting a bounded time) and close the scheduler."""
        self._stop.set()
        self._wake.set()
        self._thread.join(self.JOIN_S)  # a beat stuck past its timeouts is left to exit with us
        # the floor's last writes only from a thread of its own: not beside a stuck beat
        self.scheduler.close(flush=not self._thread.is_alive())

    def _note_late(self, started: float) -> None:
        """Report a beat begun late, longer than LATE_BEATS beats after the last one (a
        machine short of CPU, a floor call that hung): folds and closes lagged as long,
        and the durability windows (docs/durability.md) grew with them."""
        last, self.last_beat = self.last_beat, started
        beat = self.scheduler.beat_s
        if last is None or started - last <= LATE_BEATS * beat:
            return
        gap = started - last
        self.late += 1
        event(log, "scheduler-late", "queue %s: the scheduler's beat began %.2fs after the "
              "last one (beat %.2fs): folds and closes lagged as long", self.queue, gap, beat,
              level=logging.WARNING, queue=self.queue, gap_s=round(gap, 3),
              since=round(time.time() - (time.monotonic() - last), 3))

    def _run(self) -> None:
        while True:
            wait = max(0.0, self.scheduler.deadline() - time.monotonic())
            self._wake.wait(wait)  # the wake event doubles as the beat's timer
            self._wake.clear()
            if self._stop.is_set():
                return
            self.beat_started = time.monotonic()
            poked, self._poked = self._poked, False
            try:
                if poked and self.beat_started < self.scheduler.deadline():
                    self.scheduler.relay_outbox()  # between two beats: the outbox alone
                else:
                    self._note_late(self.beat_started)
                    self.scheduler.tick(self.beat_started)
            except Exception:  # a thread that died would stop folding for good
                log.exception("queue %s: scheduler beat failed", self.queue)
                self.scheduler.next_tick = time.monotonic() + self.scheduler.beat_s
            finally:
                self.beat_started = None


def make_factory(settings: Any, floor: Floor | None, outbox_engine: Any = None,
                 threads: dict[str, SchedulerThread] | None = None
                 ) -> Callable[[Any], SchedulerThread]:
    """A factory the arbiter calls once per queue: a scheduler with the floor for queues
    whose dial is not volatile, one for crons alone otherwise (or without a floor); with
    ``outbox_engine``, each relays its queue's outbox rows. ``threads`` collects them by
    queue (the outbox listener pokes them)."""
    def factory(rt: Any) -> SchedulerThread | None:
        dial = settings.durability_of(rt.spec)
        volatile = floor is None or dial == "volatile"
        scheduler = Scheduler(
            rt.spec.name, rt.metronome.client, None if volatile else floor,
            beat_ms=settings.beat_ms, horizon_s=settings.spill_horizon)
        scheduler.durable = dial == "durable"
        if outbox_engine is not None:
            from echomq.supervisor.relay import Relay

            scheduler.relay = Relay(rt.spec.name, rt.metronome.client, outbox_engine)
        thread = SchedulerThread(scheduler)
        if threads is not None:
            threads[rt.spec.name] = thread
        return thread

    return factory  # type: ignore[return-value]
