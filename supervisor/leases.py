"""The leases: what keeps running jobs theirs, and what ends a child for its jobs' sake.

Owns the extension of every lease a live child has (what its holdings list, what its
claims record names beyond them, and the hand-backs kept while the server was away),
the time limits a sync handler cannot enforce inside its process (the child is killed;
its jobs fail as timed out), and the recycle of a child over the memory limit (a stop
after its job; a child past ``--max-jobs`` leaves by itself with EXIT_RECYCLE). The
loop asks :meth:`Leases.deadlines` when to come back and calls :meth:`Leases.on_timers`.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING

from echomq.supervisor.holdings import RUNNING
from echomq.supervisor.logs import event
from echomq.supervisor.recycle import over_memory

from echomq import scripts
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.lanes import unheld_claims

if TYPE_CHECKING:
    from echomq.supervisor.arbiter import Arbiter

log = logging.getLogger("echomq.supervisor")
RECYCLE_CHECK_S = 5.0


class Leases:
    """Extends the children's leases, enforces time limits, recycles children over memory."""

    def __init__(self, house: Arbiter) -> None:
        self.house = house
        self.next_extend = 0.0
        self.next_recycle = 0.0

    def deadlines(self) -> list[float]:
        """When the loop must come back for them: the next extension (while any child
        lives), the earliest time limit of a running job, the next memory check."""
        house = self.house
        out = []
        if any(rt.children for rt in house.queues.values()):
            out.append(self.next_extend)
        out += [d for rt in house.queues.values() for c in rt.children
                if not c.timed_out and (d := c.holdings.deadline())]
        if house.settings.max_memory_mb:
            out.append(self.next_recycle)
        return out

    def keep(self, now: float) -> None:
        """Enforce the time limits that passed, then extend the leases when due (also while
        draining: running jobs keep their leases)."""
        self.enforce_time_limits(now)
        if now >= self.next_extend:
            self.extend(now)
            self.next_extend = now + self.house.settings.lease_ms / 3000

    def recycle(self, now: float) -> None:
        """Recycle children over the memory limit, every RECYCLE_CHECK_S."""
        if self.house.settings.max_memory_mb and now >= self.next_recycle:
            self.recycle_over_memory()
            self.next_recycle = now + RECYCLE_CHECK_S

    def enforce_time_limits(self, now: float) -> None:
        """End a child whose running job passed its time limit (a sync handler cannot be
        interrupted inside its process); its slot respawns at once."""
        for rt in self.house.queues.values():
            for child in rt.children:
                deadline = child.holdings.deadline()
                if not deadline or deadline > now or child.timed_out:
                    continue
                late = [h for h in child.holdings.entries()
                        if h.state == RUNNING and h.deadline and h.deadline <= now]
                if not late:
                    continue
                child.timed_out = {h.job_id: h.timeout for h in late}
                child.respawn_now = True
                event(log, "timeout", "queue %s: consumer %d ran job %s past its limit of "
                      "%gs; ending it", rt.spec.name, child.pid, late[0].job_id,
                      late[0].timeout, level=logging.WARNING, queue=rt.spec.name,
                      pid=child.pid)
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def extend(self, now: float) -> None:
        """Extend every lease a live child has: what its holdings list, and what its claims
        record names beyond them (a claim sent ahead is leased before the child reads its
        reply and holds it, which a long job before it can delay past a lease). Pairs the
        child settled or handed back meanwhile match no token and are left as they are.
        An extension the server refuses (out of memory under noeviction refuses it while a
        reap still runs) marks the queue down: nothing is reaped until it takes writes."""
        for rt in self.house.queues.values():
            try:
                held = []
                for child in rt.children:
                    if child.claims_unchecked and rt.healthy:  # the server was away then
                        self.house.doorbells.end_if_leased(rt, child)
                    entries = child.holdings.entries()
                    held += [h.pair for h in entries]
                    key = rt.metronome.keys.claims(child.claimer)
                    # an idle child read every reply before it said so: nothing to read then
                    # (an idle supervisor sends nothing here); the record is renewed, so it
                    # outlives a job longer than its expiry
                    if child.claimer and (entries or child.state != "idle"):
                        pipe = self.house.client.pipeline(transaction=False)
                        pipe.lrange(key, 0, -1)
                        pipe.pexpire(key, 10 * rt.settings.lease_ms)
                        raw, _ = pipe.execute()
                        held += unheld_claims(raw, {h.pair for h in entries})
                    elif child.claimer and (child.claims_unchecked or
                                            self.house.doorbells.parked_overdue(rt, child, now)):
                        # a parked child silent past its block: the claim behind its pop
                        # (its newest) may have leased a job it has not read
                        held += unheld_claims(self.house.client.lrange(key, -2, -1), set())
                held += [pair for kind, pairs, _ in rt.unreleased if kind == "jobs"
                         for pair in pairs]
                if held:
                    scripts.extend(self.house.client, rt.metronome.keys, rt.settings.lease_ms, held)
            except UNAVAILABLE_ERRORS as exc:
                log.warning("queue %s: lease extension failed: %s", rt.spec.name, exc)
                if rt.healthy:
                    self.house.queue_down(rt, now, exc)

    def recycle_over_memory(self) -> None:
        """Stop each child over the memory limit after its job; its slot respawns."""
        limit = self.house.settings.max_memory_mb
        if not limit:
            return
        for rt in self.house.queues.values():
            for child in rt.children:
                if not child.stop_sent and over_memory(child.pid, limit):
                    event(log, "recycle", "queue %s: consumer %d over %d MiB; recycling after "
                          "its job", rt.spec.name, child.pid, limit, queue=rt.spec.name,
                          pid=child.pid)
                    child.respawn_now = True
                    self.house.children.stop(child)
