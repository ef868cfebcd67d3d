"""The scheduler's fold: deferred and retried jobs onto the floor, finished jobs off it.

The fold log (jobs that entered the schedule set) is written to the floor as rows;
the closed log (jobs that completed, died or were cancelled) drops their rows, after
copying a spilled job's row into its cancelled stub. When nobody folded for longer
than the fold lease, or the logs outgrew their bound, a sweep folds what the logs
missed: the schedule set, then the lanes, then the leases, then the blocked jobs, a
slice a tick.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from echomq.supervisor.floorrows import BATCH, SCHEDULED_STATES, FloorWork, _text, log
from echomq.supervisor.logs import event

from echomq import scripts
from echomq.queue import backfill_args


class Folding(FloorWork):
    """The fold and closed logs, the backlog bound and the sweep."""

    folded: int
    closed: int
    backlog: int
    closed_backlog: int
    backlog_dropped: int
    max_backlog: int
    next_orphan_check: float
    sweep_offset: int | None  # a ZSCAN cursor, or a lane's distance from its tail
    sweep_phase: str
    sweep_lanes: list[str]
    sweep_ended: bool  # told to the next lead call, which clears meta "sweep"

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
        """Drop the floor rows of jobs that completed or died: a batch of the closed log
        read and sorted by one script call (closed_read.lua), its rows deleted, then the
        batch trimmed from the log."""
        while True:
            read, done, stubs = scripts.CLOSED_READ(
                self.client, [self.keys.closed, self.keys.spilled], [self.keys.prefix, BATCH])
            if not read:
                return
            assert self.fence is not None
            ids = [_text(x) for x in done]
            if stubs:
                self._backfill([_text(x) for x in stubs])
            self.closed += self.floor.close_jobs(self.queue, ids, self.fence)
            self.client.ltrim(self.keys.closed, read, -1)
            if read < BATCH or self._over_budget():
                return

    def _backfill(self, stubs: Sequence[str]) -> None:
        """A job cancelled while spilled holds a small hash: its floor row's fields are
        copied in before the row goes (backfill.lua keeps the cancel's own fields)."""
        args = backfill_args(self.keys, self.floor.rows(self.queue, stubs))
        if len(args) > 1:
            scripts.BACKFILL(self.client, [self.keys.cancelled], args)

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

    def _start_sweep(self) -> None:
        self.sweep_ended = False
        self.sweep_offset = 0
        self.sweep_phase = "schedule"
        self.sweep_lanes = []

    def _sweep(self) -> None:
        """Fold one batch of jobs nobody folded: the schedule set's first, then those
        released or promoted meanwhile, on the lanes, then leased (the way jobs move, so
        one that moves on during the sweep is met again), then the blocked ones (waitdeps).
        A job that moves back, from its lease to its lane (a release, a reap, a drain's
        hand-back), may miss every phase: reap.lua appends it to the fold log instead (the
        lead call that started the sweep renewed the fold lease), as schedule.lua and
        settle.lua do a job entering the schedule set, and deps.lua a blocked job whose
        dependency ended (so one released during the sweep is logged as it leaves
        waitdeps). Idempotent with the fold log.

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
            key = {"blocked": self.keys.waitdeps, "schedule": self.keys.schedule}.get(
                self.sweep_phase, self.keys.leases)
            cursor, pairs = self.client.zscan(key, cursor, count=BATCH)
            ids = [_text(member) for member, _ in pairs]
            if self.sweep_phase == "blocked":
                rows = self._rows(ids, ("blocked",))
            elif self.sweep_phase == "schedule":
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
        elif self.sweep_phase == "leases":
            self.sweep_phase = "blocked"
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
