"""The scheduler: folds deferred and retried jobs onto the SQL floor, spills far-future
jobs out of Valkey, restores them as they come within the horizon, and rehydrates
the schedule set when Valkey has lost its data.

One scheduler per queue is active across all replicas (a leader lease in Valkey
whose fencing token the floor checks). Every step is idempotent: a job id is a
primary key on the floor and ``ZADD NX`` / "hash exists" in Valkey. When the
floor is down the queue keeps running on Valkey alone; the fold log simply
grows until the floor answers again.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.exceptions
from echomq.supervisor.logs import event

from echomq import scripts
from echomq.connection import NETWORK_ERRORS
from echomq.errors import FloorError, StaleFence
from echomq.floor import Floor, FloorRow
from echomq.keys import Keys

log = logging.getLogger("echomq.scheduler")
BATCH = 1000
TICK_BUDGET_S = 0.1  # floor work per tick; the rest continues on the next turn of the loop
REHYDRATING = "rehydrating-"  # epoch value while a rehydration is under way
FLOOR_BACKOFF_MAX_S = 30.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Scheduler:
    """The floor side of one queue: ``tick`` when ``deadline`` (:class:`SchedulerThread`)."""

    def __init__(self, queue: str, client: redis.Redis, floor: Floor, *, beat_ms: int,
                 horizon_s: float, clock_offset_ms: int = 0) -> None:
        self.queue = queue
        self.keys = Keys(queue)
        self.client = client
        self.floor = floor
        self.beat_s = beat_ms / 1000
        self.horizon_ms = int(horizon_s * 1000)
        self.clock_offset_ms = clock_offset_ms  # tests and drills move the scheduler's clock
        self.replica = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_ms = max(3000, int(beat_ms * 5))
        self.fence: int | None = None
        self.next_tick = 0.0
        self.next_restore = 0.0
        self.floor_retry_at = 0.0
        self.sweep_offset: int | None = None  # folding the whole schedule set after election
        self.budget_end = 0.0
        self.rehydration: str | None = None  # our in-progress epoch token
        self.rehydrate_after: str | None = None
        self.rehydrate_count = 0
        self.restore_every_s = max(self.beat_s, min(10 * self.beat_s, horizon_s / 4))
        self.floor_ok = True
        self.floor_error = ""
        self.floor_failures = 0
        self.folded = self.closed = self.spilled = self.restored = self.rehydrated = 0
        self.backlog = 0

    # --- the arbiter's interface ---------------------------------------------------

    def deadline(self) -> float:
        return self.next_tick

    def tick(self, now: float) -> None:
        """One beat of floor work; never raises for an unreachable Valkey or floor."""
        self.next_tick = now + self.beat_s
        try:
            self._tick(now, floor_work=now >= self.floor_retry_at)
        except NETWORK_ERRORS as exc:
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
        return {
            "floor": "ok" if self.floor_ok else f"down: {self.floor_error}",
            "leader": self.fence is not None, "folded": self.folded, "closed": self.closed,
            "spilled": self.spilled, "restored": self.restored, "backlog": self.backlog,
            "rehydrated": self.rehydrated,
        }

    def close(self) -> None:
        if self.fence is not None:
            try:  # hand leadership on at once instead of after the lease runs out
                held = self.client.get(self.keys.leader)
                if held and _text(held).startswith(self.replica + "|"):
                    self.client.delete(self.keys.leader)
            except NETWORK_ERRORS:
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
        fence, fold_len, closed_len, epoch, spill_candidates, server_now = scripts.LEAD(
            self.client,
            [self.keys.leader, self.keys.fold, self.keys.closed, self.keys.epoch,
             self.keys.schedule],
            [self.replica, self.lease_ms, self.horizon_ms + self.clock_offset_ms])
        fence = int(fence)
        self.backlog = int(fold_len)
        if fence < 0:
            self.fence = None
            return
        if self.fence != fence:
            event(log, "scheduler-lead", "queue %s: this replica now runs the scheduler",
                  self.queue, queue=self.queue)
            # jobs scheduled while nobody folded (before any scheduler set the fold flag)
            # reach the floor by a sweep of the schedule set, a batch per beat
            self.sweep_offset = 0
        self.fence = fence
        if not floor_work:  # the floor is backing off: the lease is renewed, nothing more
            return
        epoch = _text(epoch)
        rehydrating = not epoch or epoch.startswith(REHYDRATING)
        if rehydrating and not self._rehydrate(int(server_now), epoch):
            return
        if int(fold_len):
            self._fold()
        if int(closed_len) and not self._over_budget():
            self._close()
        if int(spill_candidates) and not self._over_budget():
            self._spill(int(server_now))
        if now >= self.next_restore and not self._over_budget():
            self._restore_due(int(server_now))
            self.next_restore = now + self.restore_every_s
        if self.sweep_offset is not None and not self._over_budget():
            self._sweep()

    def _sweep(self) -> None:
        """Fold one batch of the schedule set; idempotent with the fold log."""
        assert self.sweep_offset is not None
        ids = [_text(x) for x in self.client.zrange(
            self.keys.schedule, self.sweep_offset, self.sweep_offset + BATCH - 1)]
        rows = [FloorRow(job_id=i, due_ms=int(h.get("due_ms") or 0), fields=h)
                for i, h in zip(ids, self._hashes(ids), strict=True)
                if h.get("state") == "scheduled"]
        self.floor.upsert(self.queue, rows, self.fence)
        self.folded += len(rows)
        self.sweep_offset = None if len(ids) < BATCH else self.sweep_offset + BATCH

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
            rows = [
                FloorRow(job_id=job_id, due_ms=int(h.get("due_ms") or 0), fields=h)
                for job_id, h in zip(ids, self._hashes(ids), strict=True)
                if h and h.get("state") in ("scheduled", "waiting", "active")
            ]
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
            self.closed += self.floor.close_jobs(self.queue, [_text(x) for x in raw], self.fence)
            self.client.ltrim(self.keys.closed, len(raw), -1)
            if len(raw) < BATCH or self._over_budget():
                return

    def _spill(self, server_now: int) -> None:
        """Move jobs due beyond the horizon out of Valkey memory, floor first."""
        floor_of = server_now + self.clock_offset_ms + self.horizon_ms
        while True:
            ids = [_text(x) for x in self.client.zrangebyscore(
                self.keys.schedule, f"({floor_of}", "+inf", start=0, num=BATCH)]
            if not ids:
                return
            rows = [FloorRow(job_id=i, due_ms=int(h.get("due_ms") or 0), fields=h, spilled=True)
                    for i, h in zip(ids, self._hashes(ids), strict=True)
                    if h.get("state") == "scheduled"]
            assert self.fence is not None
            self.floor.upsert(self.queue, rows, self.fence)
            args: list[Any] = [self.keys.prefix]
            for row in rows:
                args += [row.job_id, row.due_ms]
            flags = scripts.SPILL(self.client, [self.keys.schedule, self.keys.meta], args)
            kept = [row.job_id for row, flag in zip(rows, flags, strict=True) if not flag]
            if kept:  # changed meanwhile: they stay in Valkey, so not spilled on the floor
                self.floor.upsert(self.queue, [FloorRow(r.job_id, r.due_ms, r.fields)
                                               for r in rows if r.job_id in set(kept)],
                                  self.fence)
            self.spilled += len(rows) - len(kept)
            if len(ids) < BATCH or len(kept) == len(ids) or self._over_budget():
                return

    def _restore_due(self, server_now: int) -> None:
        """Bring spilled jobs back into the schedule set as they come within the horizon."""
        until = server_now + self.clock_offset_ms + self.horizon_ms
        assert self.fence is not None
        while True:
            count = self.floor.restore_due(self.queue, until, BATCH, self.fence,
                                           self._apply("spilled"))
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
            self.rehydration = REHYDRATING + uuid.uuid4().hex
            self.rehydrate_after = None
            self.rehydrate_count = 0
            self.client.set(self.keys.epoch, self.rehydration)
            self.client.hset(self.keys.meta, "fold", "1")
        apply = self._apply("all")
        until = server_now + self.clock_offset_ms + self.horizon_ms
        while True:
            rows = self.floor.open_rows(self.queue, self.rehydrate_after, BATCH)
            if not rows:
                break
            due_soon = [r for r in rows if not r.spilled or r.due_ms < until]
            apply(due_soon)
            back = [FloorRow(r.job_id, r.due_ms, r.fields) for r in due_soon if r.spilled]
            if back:  # in Valkey again: no longer spilled
                assert self.fence is not None
                self.floor.upsert(self.queue, back, self.fence)
            self.rehydrate_count += len(due_soon)
            self.rehydrate_after = rows[-1].job_id
            if self._over_budget():
                return False
        spilled = self.floor.count(self.queue, spilled=True)
        self.client.hset(self.keys.meta, "spilled", spilled)
        self.client.set(self.keys.epoch, uuid.uuid4().hex)
        restored = self.rehydrate_count
        self.rehydrated += restored
        self.rehydration = None
        event(log, "rehydrate", "queue %s: epoch missing; restored %d job(s) from the floor "
              "(%d stay spilled)", self.queue, restored, spilled, queue=self.queue,
              count=restored)
        return True

    def _apply(self, mode: str) -> Callable[[list[FloorRow]], None]:
        def apply(rows: list[FloorRow]) -> None:
            for start in range(0, len(rows), 200):
                args: list[Any] = [self.keys.prefix, mode]
                for row in rows[start:start + 200]:
                    fields = {k: v for k, v in row.fields.items() if k != "token"}
                    args += [row.job_id, row.due_ms - self.clock_offset_ms, len(fields)]
                    for k, v in fields.items():
                        args += [k, v]
                scripts.RESTORE(self.client, [self.keys.schedule, self.keys.wake,
                                              self.keys.meta], args)
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
        return math.inf

    def tick(self, now: float) -> None:
        """Nothing: the thread keeps the beat."""

    def snapshot(self) -> dict[str, Any]:
        snap = self.scheduler.snapshot()
        started = self.beat_started
        snap["beat_running_s"] = round(time.monotonic() - started, 3) if started else 0.0
        return snap

    def close(self) -> None:
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


def make_factory(settings: Any, floor: Floor) -> Callable[[Any], SchedulerThread]:
    """A factory the arbiter calls once per queue (for queues whose dial is not volatile)."""
    offset = int(os.environ.get("ECHOMQ_CLOCK_OFFSET_MS", "0") or 0)

    def factory(rt: Any) -> SchedulerThread | None:
        if settings.durability_of(rt.spec) == "volatile":
            return None
        return SchedulerThread(Scheduler(
            rt.spec.name, rt.metronome.client, floor, beat_ms=settings.beat_ms,
            horizon_s=settings.spill_horizon, clock_offset_ms=offset))

    return factory  # type: ignore[return-value]
