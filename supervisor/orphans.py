"""The scheduler's orphan pass: a slow walk over the floor's open rows that closes those
whose job finished but whose close was missed (a late sync write, logs dropped or
lapsed) and re-marks those whose job is spilled.
"""

from __future__ import annotations

from echomq.supervisor.floorrows import BATCH, SCHEDULED_STATES, FloorWork, _text, log
from echomq.supervisor.logs import event


class Orphans(FloorWork):
    """One slice of the orphan pass per due tick."""

    orphan_every_s: float
    next_orphan_check: float
    orphan_after: str | None  # the orphan pass's place on the floor
    orphans_closed: int

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
