"""The metronome's pass over expired jobs (echomq.expiry): each queue's waiting and
scheduled jobs whose expiry passed are cancelled ("expired"), so they leave their lanes and
the schedule even where no claim meets them.

Paced by a local timer, not by polling for work: a beat apart while the queue has jobs
with an expiry (the pass says when its zset empties), every ``IDLE_BEATS`` otherwise (a
job admitted with an expiry since is caught by the claim that meets it, or by this).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from echomq.supervisor.logs import event

from echomq.connection import UNAVAILABLE_ERRORS
from echomq.expiry import expire_pass

if TYPE_CHECKING:
    from echomq.supervisor.arbiter import Arbiter

log = logging.getLogger("echomq.supervisor")
IDLE_BEATS = 30


class ExpiryPasses:
    """One timer per queue; the arbiter asks for deadlines and calls :meth:`on_timers`."""

    def __init__(self, house: Arbiter) -> None:
        self.house = house
        self.next_at: dict[str, float] = {name: 0.0 for name in house.queues}

    def deadlines(self) -> list[float]:
        """When each queue's pass is next due (monotonic s)."""
        return list(self.next_at.values())

    def on_timers(self, now: float) -> None:
        """Run the passes that are due, on queues the server answers for."""
        for name, rt in self.house.queues.items():
            if now < self.next_at[name] or not rt.healthy:
                continue
            beat = rt.metronome.beat_s
            try:
                expired, head = expire_pass(self.house.client, rt.metronome.keys)
            except UNAVAILABLE_ERRORS as exc:
                log.warning("queue %s: expiry pass failed: %s", name, exc)
                self.next_at[name] = now + beat
                continue
            if expired:
                event(log, "expired", "queue %s: %d job(s) expired before they started",
                      name, expired, queue=name, count=expired)
            self.next_at[name] = now + (beat if head is not None else IDLE_BEATS * beat)
