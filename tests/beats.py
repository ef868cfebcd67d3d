"""A scheduler's beats driven by a test: the clock is the test's, not the scheduler's."""

from __future__ import annotations

from echomq.supervisor.scheduler import Scheduler


def tick(s: Scheduler) -> None:
    """One beat now, whatever backoff the last one chose, and the immediate follow-up
    ticks a beat with more work than its time budget asks for."""
    while True:
        s.next_restore = 0.0
        s.floor_retry_at = 0.0
        s.tick(0.0)
        if s.next_tick != 0.0:
            return
