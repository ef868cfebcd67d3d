"""When a reaper may reap again after its server was away.

Nobody can extend a lease while the server is unreachable or refuses writes, so leases
run out during an outage that belong to jobs still running. Once the server answers
again, each holder extends its leases within a third of a lease of its own return (the
heartbeat's period), so a reaper that saw the server away long enough for a lease to
run out waits one lease period after its return before it reaps. A blip shorter than a
third of a lease cannot have let a live lease run out (its holder missed one extension
at most), so it defers nothing: repeated blips never keep a dead consumer's jobs held.
"""

from __future__ import annotations

import threading


def held_until(down_since: float, now: float, lease_s: float) -> float:
    """After an outage from ``down_since`` to ``now``: no reap before the returned time
    (monotonic seconds; 0.0 after a blip shorter than a third of a lease)."""
    return now + lease_s if now - down_since >= lease_s / 3 else 0.0


class ReapGrace:
    """One reaper's view of its server's outages, fed by every call it makes (from any
    thread: a consumer's main loop and its heartbeat)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.down_since: float | None = None  # the first failure of the current outage
        self.not_before = 0.0  # no reap before this (monotonic seconds)
        self._lock = threading.Lock()

    def failed(self, now: float) -> None:
        """A call to the server failed (unreachable, or writes refused)."""
        with self._lock:
            if self.down_since is None:
                self.down_since = now

    def answered(self, now: float) -> None:
        """A call succeeded: after an outage of a third of a lease or more, hold the reap
        for a lease period from now."""
        with self._lock:
            if self.down_since is None:
                return
            self.not_before = max(self.not_before,
                                  held_until(self.down_since, now, self.lease_s))
            self.down_since = None

    def hold(self, deadline: float) -> float:
        """A reap deadline, put off past the grace of the last outage."""
        return max(deadline, self.not_before)
