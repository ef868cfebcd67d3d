"""The scheduler's rehydration: when Valkey has lost its data (its epoch is missing),
every open floor row comes back, the lane limits first; rows still spilled come back
as stubs. It runs over as many ticks as it needs, under a mark in the epoch key.
"""

from __future__ import annotations

import uuid

from echomq.supervisor.floorrows import BATCH, FloorWork, log
from echomq.supervisor.logs import event

from echomq import scripts
from echomq.floor import FloorRow

REHYDRATING = "rehydrating-"  # epoch value while a rehydration is under way


class Rehydrating(FloorWork):
    """Put Valkey back together from the floor after a data loss."""

    fold_grace_ms: int
    rehydration: str | None  # our in-progress epoch token
    rehydrate_after: str | None
    rehydrate_count: int
    rehydrated: int
    limits_restored: int

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
