"""Recent throughput for the dashboard's chart: running totals sampled at a fixed period.

The totals (completed, retried, dead) are counters kept by the scripts, so the
rate over an interval is the difference of two samples; nothing new is written
to Valkey. The history covers the time this process has been sampling.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

SAMPLE_S = 5.0
KEEP = 180  # 15 minutes at 5 s


class History:
    """Per-queue samples (unix time, completed, failed); ``failed`` = retried + dead."""

    def __init__(self, totals: Callable[[], dict[str, dict[str, Any]]],
                 period_s: float = SAMPLE_S) -> None:
        self.totals = totals
        self.period_s = period_s
        self.samples: dict[str, deque[tuple[float, int, int]]] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="echomq-history", daemon=True)

    def start(self) -> History:
        """Start sampling in the background; returns self."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (the thread ends at its next wake-up)."""
        self.stopped.set()

    def sample(self) -> None:
        """Record one point per queue; an unreachable server leaves a gap."""
        try:
            totals = self.totals()
        except Exception:  # an unreachable server leaves a gap in the chart, nothing more
            return
        now = time.time()
        with self.lock:
            for name, s in totals.items():
                ring = self.samples.setdefault(name, deque(maxlen=KEEP + 1))
                ring.append((now, int(s["completed"]), int(s["retried"]) + int(s["dead"])))

    def rates(self, queue: str) -> list[tuple[float, float, float]]:
        """(end time, completed per minute, failed per minute) per interval, oldest first."""
        with self.lock:
            points = list(self.samples.get(queue, ()))
        out = []
        for (t0, c0, f0), (t1, c1, f1) in zip(points, points[1:], strict=False):
            span = max(t1 - t0, 1e-3) / 60
            out.append((t1, max(0, c1 - c0) / span, max(0, f1 - f0) / span))
        return out

    def _run(self) -> None:
        # the chart needs samples at a fixed period and no event marks "a period passed":
        # the wait on `stopped` is that clock, and ends at once on stop()
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(self.period_s)
