"""What every pass of the scheduler over the floor shares: the scheduler's state they
read (queue, keys, clients, fence, clock, budget and counters), a job's floor row read
from its hash, the setting aside of malformed jobs, and the putting back of floor rows
into Valkey (restore.lua) or as stubs (spill.lua).

The passes themselves live in :mod:`echomq.supervisor.fold` (the fold and closed logs,
the sweep), :mod:`echomq.supervisor.spill` (spill and restore), :mod:`echomq.supervisor.rehydrate`
and :mod:`echomq.supervisor.orphans`; :class:`echomq.supervisor.scheduler.Scheduler`
joins them and keeps the leader lease and the beat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from echomq import scripts
from echomq.floor import Floor, FloorRow
from echomq.keys import Keys

log = logging.getLogger("echomq.scheduler")
BATCH = 1000
# states of a job the floor holds while it lives (a blocked one waits for dependencies)
SCHEDULED_STATES = ("scheduled", "waiting", "active", "blocked")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _due_ms(h: dict[str, str]) -> int | None:
    """The hash's due time, or None when it is not an integer (a malformed job)."""
    due = h.get("due_ms") or "0"
    return int(due) if due.isdigit() and len(due) <= 15 else None


class FloorWork:
    """The scheduler's state the floor passes share (set by ``Scheduler.__init__``), and
    the row helpers they all use."""

    queue: str
    keys: Keys
    client: redis.Redis
    floor: Floor
    fence: int | None
    clock_offset_ms: int
    horizon_ms: int
    next_tick: float
    budget_end: float  # monotonic end of this tick's share of floor work
    buried: int
    buried_open: list[str]  # buried jobs whose floor rows are still to close

    def _over_budget(self) -> bool:
        """True once this tick has used its share of the loop: come back at once."""
        if time.monotonic() < self.budget_end:
            return False
        self.next_tick = 0.0
        return True

    def _hashes(self, ids: Sequence[str]) -> list[dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        return [{_text(k): _text(v) for k, v in h.items()} for h in pipe.execute()]

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
                                   self.keys.spilled, self.keys.events], args)
        self.buried += len(pairs)
        self.buried_open += [job_id for job_id, _ in pairs]
        if close:
            self._close_buried()

    def _close_buried(self) -> None:
        if self.buried_open:
            assert self.fence is not None
            self.floor.close_jobs(self.queue, self.buried_open, self.fence)
            self.buried_open = []

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
        """What puts floor rows back into Valkey (restore.lua, mode "spilled" or "all"),
        setting aside rows the floor could not read."""
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
