"""The scheduler's rehydration: when Valkey has lost its data (its epoch is missing),
every open floor row comes back, the lane limits first; rows still spilled come back
as stubs. Blocked jobs come back blocked and, once every other row is back, their
fan-in is rebuilt (reblock.lua): a dependency whose row was closed ended before the
loss and counts as completed. It runs over as many ticks as it needs, under a mark in
the epoch key.
"""

from __future__ import annotations

import uuid

from echomq.supervisor.floorrows import BATCH, FloorWork, log
from echomq.supervisor.logs import event

from echomq import durable, scripts
from echomq.floor import FloorRow

REHYDRATING = "rehydrating-"  # epoch value while a rehydration is under way


class Rehydrating(FloorWork):
    """Put Valkey back together from the floor after a data loss."""

    fold_grace_ms: int
    rehydration: str | None  # our in-progress epoch token
    rehydrate_after: tuple[int, str] | None  # (seq, job id) of the last row restored
    rehydrate_count: int
    rehydrate_phase: str  # "rows": the walk over the floor; "deps": the blocked jobs' fan-in
    rehydrate_cursor: int  # ZSCAN cursor over waitdeps in phase "deps"
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
            self.rehydrate_phase, self.rehydrate_cursor = "rows", 0
            self.client.set(self.keys.epoch, self.rehydration)
            self.client.hset(self.keys.meta, "fold", server_now + self.fold_grace_ms)
            self._restore_limits(limits)  # the lane limits come back before any job does
        apply = self._apply("all")
        until = server_now + self.clock_offset_ms + self.horizon_ms
        while self.rehydrate_phase == "rows":
            rows = self.floor.rows_in_order(self.queue, self.rehydrate_after, BATCH)
            if not rows:
                self.rehydrate_phase = "deps"
                break
            due_soon = [r for r in rows if not r.spilled or r.due_ms < until]
            later = [r for r in rows if r.spilled and r.due_ms >= until]
            self._stub(later)  # still spilled: each keeps a stub, and its id stays taken
            waiting = [r for r in due_soon if _waiting(r)]
            blocked = [r for r in due_soon if _blocked(r)]
            apply([r for r in due_soon if not _waiting(r) and not _blocked(r)])
            self._requeue(waiting)  # back on their lanes, in admit order
            self._hold(blocked)  # blocked again; their fan-in once every row is back
            back = [FloorRow(r.job_id, r.due_ms, r.fields) for r in due_soon if r.spilled]
            if back:  # in Valkey again: no longer spilled
                assert self.fence is not None
                self.floor.upsert(self.queue, back, self.fence)
            self._close_buried()
            self.rehydrate_count += len(due_soon)
            self.rehydrate_after = (rows[-1].seq or 0, rows[-1].job_id)
            if self._over_budget():
                return False
        if not self._rebuild_fanin():
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

    def _requeue(self, rows: list[FloorRow]) -> None:
        """Waiting jobs' rows straight back onto their lanes, in the order given."""
        for start in range(0, len(rows), 200):
            args = durable.requeue_args(self.keys, rows[start:start + 200])
            durable.REQUEUE(self.client, durable.requeue_keys(self.keys), args)

    def _hold(self, rows: list[FloorRow]) -> None:
        """Blocked jobs' rows back as blocked jobs, their fan-in not counted yet."""
        for start in range(0, len(rows), 200):
            args = durable.requeue_args(self.keys, rows[start:start + 200])
            scripts.REBLOCK(self.client, [self.keys.waitdeps], [args[0], "hold", *args[1:]])

    def _rebuild_fanin(self) -> bool:
        """Every open row is back: count the held blocked jobs' dependencies (reblock.lua,
        "fanin"), a ZSCAN batch of waitdeps at a time. True once done."""
        while True:
            cursor, pairs = self.client.zscan(self.keys.waitdeps, self.rehydrate_cursor,
                                              count=BATCH)
            ids = [member.decode() if isinstance(member, bytes) else member
                   for member, _ in pairs]
            for start in range(0, len(ids), 200):
                scripts.REBLOCK(self.client, [self.keys.waitdeps],
                                [self.keys.prefix, "fanin", *ids[start:start + 200]])
            self.rehydrate_cursor = cursor
            if cursor == 0:
                return True
            if self._over_budget():
                return False

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


def _blocked(row: FloorRow) -> bool:
    """A row of a job waiting for its dependencies (readable)."""
    return not row.spilled and row.error is None and row.fields.get("state") == "blocked"


def _waiting(row: FloorRow) -> bool:
    """A row of a job that was waiting on its lane (not spilled, readable)."""
    return not row.spilled and row.error is None and row.fields.get("state") == "waiting"
