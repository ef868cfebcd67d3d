"""The scheduler's spill and restore: jobs due beyond the horizon leave Valkey's memory
for the floor (the floor written first; each keeps a stub in Valkey), and come back
into the schedule set as they come within the horizon.
"""

from __future__ import annotations

from typing import Any

from echomq.supervisor.floorrows import BATCH, FloorWork, _text

from echomq import scripts
from echomq.floor import FloorRow


class Spilling(FloorWork):
    """Spill far-future jobs to the floor; restore them as they fall due."""

    spilled: int
    restored: int

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
