"""The scheduler: folds deferred and retried jobs onto the SQL floor, spills far-future
jobs out of Valkey, restores them as they come within the horizon, and rehydrates
the schedule set when Valkey has lost its data. It also admits the queue's crons
(:mod:`echomq.supervisor.crontab`), waking for their next occurrence.

One scheduler per queue is active across all replicas (a leader lease in Valkey
whose fencing token the floor checks). Every step is idempotent: a job id is a
primary key on the floor and ``ZADD NX`` / "hash exists" in Valkey. When the
floor is down the queue keeps running on Valkey alone; the fold log simply
grows until the floor answers again. A supervisor without a floor (or a queue whose
dial is volatile) runs a scheduler for crons alone, which leads only while the queue
has crons (it looks every ``CRON_PROBE_BEATS`` beats).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis
import redis.exceptions
from echomq.supervisor.crontab import CronTable
from echomq.supervisor.logs import event

from echomq import scripts
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.errors import FloorError, StaleFence
from echomq.floor import Floor, FloorRow
from echomq.keys import Keys
from echomq.queue import backfill_args

log = logging.getLogger("echomq.scheduler")
BATCH = 1000
TICK_BUDGET_S = 0.1  # floor work per tick; the rest continues on the next turn of the loop
REHYDRATING = "rehydrating-"  # epoch value while a rehydration is under way
FLOOR_BACKOFF_MAX_S = 30.0
DEFAULT_FOLD_GRACE_S = 300.0  # how long the logs keep growing after the last scheduler left
DEFAULT_MAX_BACKLOG = 1_000_000  # fold log entries kept while the floor is down
DEFAULT_ORPHAN_EVERY_S = 60.0  # a full pass over the floor's rows looking for orphans
SCHEDULED_STATES = ("scheduled", "waiting", "active")
CRON_PROBE_BEATS = 5  # a scheduler without a floor looks for crons this often


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _due_ms(h: dict[str, str]) -> int | None:
    """The hash's due time, or None when it is not an integer (a malformed job)."""
    due = h.get("due_ms") or "0"
    return int(due) if due.isdigit() and len(due) <= 15 else None


class Scheduler:
    """The floor side of one queue: ``tick`` when ``deadline`` (:class:`SchedulerThread`)."""

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
        # after a lapse of the fold lease: folding the schedule set, then the deferred jobs
        # promoted meanwhile (on the lanes, then leased), a batch at a time
        self.sweep_offset: int | None = None  # a ZSCAN cursor, or a lane's distance from its tail
        self.sweep_phase = "schedule"
        self.sweep_lanes: list[str] = []
        self.sweep_ended = False  # told to the next lead call, which clears meta "sweep"
        self.budget_end = 0.0
        self.rehydration: str | None = None  # our in-progress epoch token
        self.rehydrate_after: str | None = None
        self.rehydrate_count = 0
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

    # --- the arbiter's interface ---------------------------------------------------

    def deadline(self) -> float:
        """When the scheduler must next act: its beat or the next cron occurrence."""
        return min(self.next_tick, self.next_cron)

    def tick(self, now: float) -> None:
        """One beat of floor work; never raises for an unreachable Valkey or floor."""
        self.next_tick = now + self.beat_s
        try:
            self._tick(now, floor_work=now >= self.floor_retry_at)
        except UNAVAILABLE_ERRORS as exc:
            log.debug("queue %s: scheduler skipped a beat: %s", self.queue, exc)
        except StaleFence:
            event(log, "scheduler-deposed", "queue %s: a newer scheduler leads; standing down",
                  self.queue, queue=self.queue)
            self.fence = None
        except FloorError as exc:
            self._floor_down(now, exc)
            return
        if not self.floor_ok:
            self.floor_ok = True
            self.floor_failures = 0
            event(log, "floor-up", "queue %s: floor reachable again; caught up", self.queue,
                  queue=self.queue)

    def snapshot(self) -> dict[str, Any]:
        """Figures for /readyz and /metrics: floor state, leadership, folded, spilled, crons."""
        if not self.has_floor:  # crons alone
            return {"floor": "none", "leader": self.fence is not None,
                    "crons": len(self.crontab.specs), "cron_fired": self.crontab.fired}
        return {
            "floor": "ok" if self.floor_ok else f"down: {self.floor_error}",
            "leader": self.fence is not None, "folded": self.folded, "closed": self.closed,
            "spilled": self.spilled, "restored": self.restored, "backlog": self.backlog,
            "rehydrated": self.rehydrated, "closed_backlog": self.closed_backlog,
            "orphans_closed": self.orphans_closed, "buried": self.buried,
            "backlog_dropped": self.backlog_dropped,
            "crons": len(self.crontab.specs), "cron_fired": self.crontab.fired,
        }

    def close(self) -> None:
        """Hand the leadership on at once, if this replica holds it."""
        if self.fence is not None:
            try:  # hand leadership on at once instead of after the lease runs out
                held = self.client.get(self.keys.leader)
                if held and _text(held).startswith(self.replica + "|"):
                    self.client.delete(self.keys.leader)
            except UNAVAILABLE_ERRORS:
                pass

    # --- the beat -------------------------------------------------------------------

    def _over_budget(self) -> bool:
        """True once this tick has used its share of the loop: come back at once."""
        if time.monotonic() < self.budget_end:
            return False
        self.next_tick = 0.0
        return True

    def _tick(self, now: float, floor_work: bool = True) -> None:
        self.budget_end = time.monotonic() + TICK_BUDGET_S
        self.next_cron = math.inf
        if not self.has_floor and not self._crons_present(now):
            self.fence = None
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

    def _restore_limits(self, limits: dict[str, str]) -> None:
        """Put back the floor's lane limits Valkey lacks (after a data loss), unless the
        rehydration's mark is gone already (Valkey lost its data again: it starts over)."""
        mark, pairs = self.rehydration, list(limits.items())
        assert mark is not None
        restored = 0
        for start in range(0, len(pairs), BATCH):  # a call stays short with many lanes
            args = [x for pair in pairs[start:start + BATCH] for x in pair]
            restored += int(scripts.LIMITS_RESTORE(
                self.client, [self.keys.epoch, self.keys.limits, self.keys.meta],
                [mark, *args]))
        self.limits_restored += restored
        if restored:
            event(log, "limits-restored", "queue %s: restored %d lane limit(s) from the floor",
                  self.queue, restored, queue=self.queue, count=restored)

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

    def _drop_backlog(self) -> None:
        """The logs outgrew their bound (a long floor outage): drop them and catch up by
        a sweep of the schedule set and the orphan pass instead."""
        dropped = self.backlog + self.closed_backlog
        self.client.delete(self.keys.fold, self.keys.closed)
        self.backlog_dropped += dropped
        self.backlog = self.closed_backlog = 0
        self._start_sweep()
        self.client.hset(self.keys.meta, "sweep", str(self.fence))  # owed, as lead.lua does
        self.next_orphan_check = 0.0
        event(log, "floor-backlog-dropped", "queue %s: %d log entries over the bound of %d "
              "dropped; the schedule set will be swept instead", self.queue, dropped,
              self.max_backlog, level=logging.WARNING, queue=self.queue, count=dropped)

    def _rows(self, ids: Sequence[str], states: Sequence[str], spilled: bool = False,
              deferred_only: bool = False) -> list[FloorRow]:
        """Floor rows of the jobs among ``ids`` in one of ``states`` (with
        ``deferred_only``, of those that were deferred or retried); malformed ones are
        set aside (dead, with the reason) instead of stopping the scheduler. A spilled
        job's stub is skipped."""
        rows, bad = [], []
        for job_id, h in zip(ids, self._hashes(ids), strict=True):
            if h.get("state") not in states or (deferred_only and h.get("deferred") != "1"):
                continue
            if h.get("spilled"):  # a stub: the floor's row is the job, never written over
                continue
            due = _due_ms(h)
            if due is None:
                bad.append((job_id, f"set aside by the scheduler: malformed due_ms "
                                    f"{h.get('due_ms')!r} in the job's hash"))
            else:
                rows.append(FloorRow(job_id=job_id, due_ms=due, fields=h, spilled=spilled))
        self._bury(bad)
        return rows

    def _bury(self, pairs: Sequence[tuple[str, str]], close: bool = True) -> None:
        """Dead at once with the reason, and off the floor (at once, or by
        :meth:`_close_buried` when a floor transaction is open); logged once per job."""
        if not pairs:
            return
        args: list[Any] = [self.keys.prefix]
        for job_id, reason in pairs:
            args += [job_id, reason]
            log.error("queue %s: job %s set aside: %s", self.queue, job_id, reason)
        scripts.BURY(self.client, [self.keys.schedule, self.keys.dead, self.keys.stats,
                                   self.keys.spilled], args)
        self.buried += len(pairs)
        self.buried_open += [job_id for job_id, _ in pairs]
        if close:
            self._close_buried()

    def _close_buried(self) -> None:
        if self.buried_open:
            assert self.fence is not None
            self.floor.close_jobs(self.queue, self.buried_open, self.fence)
            self.buried_open = []

    def _close_orphans(self, now: float, epoch: str) -> None:
        """One slice of a pass over the floor: close rows whose job finished but whose
        close was missed (a late sync write, logs dropped or lapsed), and re-mark rows
        whose job is spilled. Only while Valkey holds its data (the epoch is ours)."""
        rows = self.floor.open_rows(self.queue, self.orphan_after, BATCH)
        ids = [r.job_id for r in rows if not r.spilled and r.error is None]
        if ids:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(self.keys.epoch)
            for job_id in ids:
                pipe.hget(self.keys.job(job_id), "state")
                pipe.sismember(self.keys.spilled, job_id)
            epoch_now, *found = pipe.execute()
            if epoch_now is None or _text(epoch_now) != epoch:
                return  # Valkey lost its data meanwhile: rehydration decides
            gone, spilled = [], []
            for job_id, state, is_spilled in zip(ids, found[::2], found[1::2], strict=True):
                if is_spilled:
                    spilled.append(job_id)
                elif state is None or _text(state) not in SCHEDULED_STATES:
                    gone.append(job_id)
            assert self.fence is not None
            if spilled:
                self.floor.mark_spilled(self.queue, spilled, self.fence)
            closed = self.floor.close_orphans(self.queue, gone, self.fence)
            self.orphans_closed += closed
            if closed:
                event(log, "floor-orphans", "queue %s: closed %d floor row(s) of finished "
                      "jobs", self.queue, closed, queue=self.queue, count=closed)
        if len(rows) < BATCH:
            self.orphan_after = None
            self.next_orphan_check = now + self.orphan_every_s
        else:
            self.orphan_after = rows[-1].job_id

    def _start_sweep(self) -> None:
        self.sweep_ended = False
        self.sweep_offset = 0
        self.sweep_phase = "schedule"
        self.sweep_lanes = []

    def _sweep(self) -> None:
        """Fold one batch of jobs nobody folded: the schedule set's first, then those
        promoted meanwhile, on the lanes, then leased (the way jobs move, so one that
        moves on during the sweep is met again). A job that moves back, from its lease to
        its lane (a release, a reap, a drain's hand-back), may miss every phase: reap.lua
        appends it to the fold log instead (the lead call that started the sweep renewed
        the fold lease), as schedule.lua and settle.lua do a job entering the schedule
        set. Idempotent with the fold log.

        Other processes change these keys between two batches, so no batch is found by
        its rank: the sets are walked with ZSCAN (every member present from the first
        batch to the last is returned, whatever promote, spill or settle removed
        meanwhile) and each lane from its tail (a claim pops its head, which moves no
        member's distance from the tail)."""
        assert self.sweep_offset is not None
        cursor = self.sweep_offset
        if self.sweep_phase == "lanes":
            if not self.sweep_lanes:
                self._next_sweep_phase()
                return
            ids = [_text(x) for x in self.client.lrange(
                self.sweep_lanes[-1], -(cursor + BATCH), -(cursor + 1))]
            rows = self._rows(ids, ("waiting",), deferred_only=True)
            more = len(ids) == BATCH
            cursor += BATCH
        else:
            key = self.keys.schedule if self.sweep_phase == "schedule" else self.keys.leases
            cursor, pairs = self.client.zscan(key, cursor, count=BATCH)
            ids = [_text(member) for member, _ in pairs]
            if self.sweep_phase == "schedule":
                rows = self._rows(ids, ("scheduled",))
            else:
                rows = self._rows(ids, ("active",), deferred_only=True)
            more = cursor != 0
        self.floor.upsert(self.queue, rows, self.fence)
        self.folded += len(rows)
        if more:
            self.sweep_offset = cursor
        elif self.sweep_phase == "lanes" and len(self.sweep_lanes) > 1:
            self.sweep_lanes.pop()
            self.sweep_offset = 0
        else:
            self._next_sweep_phase()

    def _next_sweep_phase(self) -> None:
        self.sweep_offset = 0
        if self.sweep_phase == "schedule":
            self.sweep_phase = "lanes"
            self.sweep_lanes = self._lane_lists()
        elif self.sweep_phase == "lanes":
            self.sweep_phase = "leases"
            self.sweep_lanes = []
        else:
            self.sweep_offset = None
            self.sweep_phase = "schedule"
            self.sweep_ended = True

    def _lane_lists(self) -> list[str]:
        """The list keys of every lane holding waiting jobs: on the plain ring, on each
        priority's ring, and those taken off a ring at a flow limit."""
        keys = [self.keys.lane(_text(x)) for x in self.client.lrange(self.keys.ring, 0, -1)]
        for level in self.client.zrange(self.keys.prios, 0, -1):
            p = int(_text(level))
            keys += [self.keys.lane(_text(x), p)
                     for x in self.client.lrange(self.keys.ring_of(p), 0, -1)]
        for entry in self.client.smembers(self.keys.blocked):
            p, _, lane = _text(entry).partition("|")
            keys.append(self.keys.lane(lane, int(p)))
        return keys

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

    def _hashes(self, ids: Sequence[str]) -> list[dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        return [{_text(k): _text(v) for k, v in h.items()} for h in pipe.execute()]

    def _fold(self) -> None:
        """Write every job that entered the schedule set since the last fold onto the floor."""
        while True:
            raw = self.client.lrange(self.keys.fold, 0, BATCH - 1)
            if not raw:
                return
            ids = [_text(x) for x in raw]
            rows = self._rows(ids, SCHEDULED_STATES)
            self.floor.upsert(self.queue, rows, self.fence)
            self.client.ltrim(self.keys.fold, len(ids), -1)
            self.folded += len(rows)
            if len(ids) < BATCH or self._over_budget():
                return

    def _close(self) -> None:
        """Drop the floor rows of jobs that completed or died."""
        while True:
            raw = self.client.lrange(self.keys.closed, 0, BATCH - 1)
            if not raw:
                return
            assert self.fence is not None
            ids = self._backfill([_text(x) for x in raw])
            self.closed += self.floor.close_jobs(self.queue, ids, self.fence)
            self.client.ltrim(self.keys.closed, len(raw), -1)
            if len(raw) < BATCH or self._over_budget():
                return

    def _backfill(self, ids: Sequence[str]) -> list[str]:
        """The ids among these closed ones whose floor rows are to go. A job cancelled
        while spilled holds a small hash: its floor row's fields are copied in first
        (backfill.lua keeps the cancel's own fields). An id that is scheduled, waiting,
        active or spilled again is a new job under the same id (added after the old one
        was purged or dropped) whose row is current: it stays."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.keys.job(job_id), "state", "spilled")
            pipe.sismember(self.keys.spilled, job_id)
        found = pipe.execute()
        done, marked = [], []
        for job_id, (state, flag), spilled in zip(ids, found[::2], found[1::2], strict=True):
            if spilled or (state is not None and _text(state) in SCHEDULED_STATES):
                continue
            done.append(job_id)
            if flag:
                marked.append(job_id)
        if not marked:
            return done
        args = backfill_args(self.keys, self.floor.rows(self.queue, marked))
        if len(args) > 1:
            scripts.BACKFILL(self.client, [self.keys.cancelled], args)
        return done

    def _spill(self, server_now: int) -> None:
        """Move jobs due beyond the horizon out of Valkey memory, floor first."""
        floor_of = server_now + self.clock_offset_ms + self.horizon_ms
        while True:
            ids = [_text(x) for x in self.client.zrangebyscore(
                self.keys.schedule, f"({floor_of}", "+inf", start=0, num=BATCH)]
            if not ids:
                return
            rows = self._rows(ids, ("scheduled",), spilled=True)
            assert self.fence is not None
            self.floor.upsert(self.queue, rows, self.fence)
            args: list[Any] = [self.keys.prefix, "schedule"]
            for row in rows:
                args += [row.job_id, row.due_ms]
            flags = scripts.SPILL(self.client, [self.keys.schedule, self.keys.spilled], args)
            kept = [row.job_id for row, flag in zip(rows, flags, strict=True) if not flag]
            if kept:  # changed meanwhile: they stay in Valkey, so not spilled on the floor
                self.floor.upsert(self.queue, [FloorRow(r.job_id, r.due_ms, r.fields)
                                               for r in rows if r.job_id in set(kept)],
                                  self.fence)
            self.spilled += len(rows) - len(kept)
            if len(ids) < BATCH or not rows or len(kept) == len(ids) or self._over_budget():
                return

    def _restore_due(self, server_now: int) -> None:
        """Bring spilled jobs back into the schedule set as they come within the horizon."""
        until = server_now + self.clock_offset_ms + self.horizon_ms
        assert self.fence is not None
        while True:
            count = self.floor.restore_due(self.queue, until, BATCH, self.fence,
                                           self._apply("spilled"))
            self._close_buried()  # after restore_due's transaction, not inside it
            self.restored += count
            if count < BATCH or self._over_budget():
                return

    def _rehydrate(self, server_now: int, epoch: str) -> bool:
        """Valkey lost its data (or this queue is new): restore every open floor row.

        Runs over as many ticks as it needs, marking the epoch "rehydrating-<token>"
        meanwhile; if that mark vanishes (Valkey lost again) or is another replica's,
        it starts over. Returns True once done.
        """
        if self.rehydration is None or epoch != self.rehydration:
            limits = self.floor.lane_limit_rows(self.queue)  # read before the mark is set
            self.rehydration = REHYDRATING + uuid.uuid4().hex
            self.rehydrate_after = None
            self.rehydrate_count = 0
            self.client.set(self.keys.epoch, self.rehydration)
            self.client.hset(self.keys.meta, "fold", server_now + self.fold_grace_ms)
            self._restore_limits(limits)  # the lane limits come back before any job does
        apply = self._apply("all")
        until = server_now + self.clock_offset_ms + self.horizon_ms
        while True:
            rows = self.floor.open_rows(self.queue, self.rehydrate_after, BATCH)
            if not rows:
                break
            due_soon = [r for r in rows if not r.spilled or r.due_ms < until]
            later = [r for r in rows if r.spilled and r.due_ms >= until]
            self._stub(later)  # still spilled: each keeps a stub, and its id stays taken
            apply(due_soon)
            back = [FloorRow(r.job_id, r.due_ms, r.fields) for r in due_soon if r.spilled]
            if back:  # in Valkey again: no longer spilled
                assert self.fence is not None
                self.floor.upsert(self.queue, back, self.fence)
            self._close_buried()
            self.rehydrate_count += len(due_soon)
            self.rehydrate_after = rows[-1].job_id
            if self._over_budget():
                return False
        spilled = self.floor.count(self.queue, spilled=True)
        # only over our own mark: Valkey losing its data again meanwhile (the mark gone)
        # restarts the rehydration, instead of calling complete what the loss took
        if self.client.set(self.keys.epoch, uuid.uuid4().hex, xx=True, get=True) is None:
            self.rehydration = None
            return False
        restored = self.rehydrate_count
        self.rehydrated += restored
        self.rehydration = None
        event(log, "rehydrate", "queue %s: epoch missing; restored %d job(s) from the floor "
              "(%d stay spilled)", self.queue, restored, spilled, queue=self.queue,
              count=restored)
        return True

    def _stub(self, rows: Sequence[FloorRow]) -> None:
        """Give these spilled rows' jobs a stub in Valkey (spill.lua, mode "rows")."""
        for start in range(0, len(rows), 200):
            args: list[Any] = [self.keys.prefix, "rows"]
            for row in rows[start:start + 200]:
                args += [row.job_id, row.due_ms, len(row.fields)]
                for k, v in row.fields.items():
                    args += [k, v]
            scripts.SPILL(self.client, [self.keys.schedule, self.keys.spilled], args)

    def _apply(self, mode: str) -> Callable[[list[FloorRow]], None]:
        def apply(rows: list[FloorRow]) -> None:
            self._bury([(r.job_id, f"set aside by the scheduler: {r.error}")
                        for r in rows if r.error is not None], close=False)
            rows = [r for r in rows if r.error is None]
            for start in range(0, len(rows), 200):
                args: list[Any] = [self.keys.prefix, mode]
                for row in rows[start:start + 200]:
                    fields = {k: v for k, v in row.fields.items() if k != "token"}
                    args += [row.job_id, row.due_ms - self.clock_offset_ms, len(fields)]
                    for k, v in fields.items():
                        args += [k, v]
                scripts.RESTORE(self.client, [self.keys.schedule, self.keys.wake,
                                              self.keys.spilled], args)
        return apply


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
        self.beat_started: float | None = None  # monotonic start of the beat in progress
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
        return snap

    def close(self) -> None:
        """Stop the thread (waiting a bounded time) and close the scheduler."""
        self._stop.set()
        self._thread.join(self.JOIN_S)  # a beat stuck past its timeouts is left to exit with us
        self.scheduler.close()

    def _run(self) -> None:
        while True:
            wait = max(0.0, self.scheduler.deadline() - time.monotonic())
            if self._stop.wait(wait):  # the stop event doubles as the beat's timer
                return
            self.beat_started = time.monotonic()
            try:
                self.scheduler.tick(self.beat_started)
            except Exception:  # a thread that died would stop folding for good
                log.exception("queue %s: scheduler beat failed", self.queue)
                self.scheduler.next_tick = time.monotonic() + self.scheduler.beat_s
            finally:
                self.beat_started = None


def make_factory(settings: Any, floor: Floor | None) -> Callable[[Any], SchedulerThread]:
    """A factory the arbiter calls once per queue: a scheduler with the floor for queues
    whose dial is not volatile, one for crons alone otherwise (or without a floor)."""
    def factory(rt: Any) -> SchedulerThread | None:
        volatile = floor is None or settings.durability_of(rt.spec) == "volatile"
        return SchedulerThread(Scheduler(
            rt.spec.name, rt.metronome.client, None if volatile else floor,
            beat_ms=settings.beat_ms, horizon_s=settings.spill_horizon))

    return factory  # type: ignore[return-value]
