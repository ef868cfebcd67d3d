"""Per-job observations made in the consumer processes, carried to the supervisor's registry.

A child cannot write into the parent's Prometheus registry, and prometheus_client's
multiprocess mode would need a shared directory of per-pid files, cleaned up after
every recycled child. The pipe each child already talks over is enough: the child
folds each job into histogram buckets (a bisect and a few additions, no per-job
I/O) and sends the folded counts as one ``OBS <json>`` line before it reports idle,
and at most once a second while it keeps draining. The parent adds them into
cumulative tallies that the /metrics collector exposes.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from typing import Any

from echomq.job import Claimed
from echomq.lanes import Outcome

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 300.0)
PICKUP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  60.0, 300.0, 3600.0)
OUTCOMES = {"c": "completed", "f": "failed", "d": "dead"}
FLUSH_EVERY_S = 1.0


def _fold(table: dict[str, list[Any]], key: str, value: float, buckets: tuple[float, ...]
          ) -> None:
    entry = table.get(key)
    if entry is None:
        entry = table[key] = [0, 0.0, [0] * (len(buckets) + 1)]
    entry[0] += 1
    entry[1] += value
    entry[2][bisect.bisect_left(buckets, value)] += 1


class Observations:
    """The child side: fold jobs in, hand out an ``OBS`` line now and then."""

    def __init__(self) -> None:
        self.duration: dict[str, list[Any]] = {}  # name -> [count, sum, buckets]
        self.pickup: dict[str, list[Any]] = {}
        self.finished: dict[str, int] = {}  # "name\toutcome" -> count
        self.flushed_at = time.monotonic()

    def record(self, claimed: Claimed, outcome: Outcome, duration_s: float,
               started_unix_ms: float) -> None:
        _fold(self.duration, claimed.name, duration_s, DURATION_BUCKETS)
        key = f"{claimed.name}\t{OUTCOMES.get(outcome.outcome, outcome.outcome)}"
        self.finished[key] = self.finished.get(key, 0) + 1
        if claimed.attempts == 1 and claimed.created_ms:
            # admission to first start; the host's clock against the server's, so clamped
            wait = max(0.0, (started_unix_ms - claimed.created_ms) / 1000)
            _fold(self.pickup, claimed.name, wait, PICKUP_BUCKETS)

    def line(self, force: bool = False) -> bytes | None:
        """The pending observations as one line (and forget them), or None."""
        if not self.finished or (not force and
                                 time.monotonic() - self.flushed_at < FLUSH_EVERY_S):
            return None
        body = {"d": self.duration, "p": self.pickup, "f": self.finished}
        self.duration, self.pickup, self.finished = {}, {}, {}
        self.flushed_at = time.monotonic()
        return b"OBS " + json.dumps(body, separators=(",", ":")).encode() + b"\n"


class TimedRunner:
    """Wraps a runner: times each job and records it in ``observations``."""

    def __init__(self, runner: Any, observations: Observations) -> None:
        self.runner = runner
        self.observations = observations

    def run(self, claimed: Claimed) -> Outcome:
        started_ms = time.time() * 1000
        t0 = time.perf_counter()
        outcome: Outcome = self.runner.run(claimed)
        self.observations.record(claimed, outcome, time.perf_counter() - t0, started_ms)
        return outcome

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


class Tally:
    """The parent side: cumulative counts per queue and job name, read by /metrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.duration: dict[tuple[str, str], list[Any]] = {}
        self.pickup: dict[tuple[str, str], list[Any]] = {}
        self.finished: dict[tuple[str, str, str], int] = {}

    def merge(self, queue: str, line: str) -> None:
        """Add one child's ``OBS`` line; a malformed line is ignored (it is only metrics)."""
        try:
            body = json.loads(line[4:])
            with self.lock:
                for src, dst in ((body["d"], self.duration), (body["p"], self.pickup)):
                    for name, (count, total, buckets) in src.items():
                        entry = dst.setdefault((queue, name), [0, 0.0, [0] * len(buckets)])
                        entry[0] += int(count)
                        entry[1] += float(total)
                        entry[2] = [a + int(b) for a, b in zip(entry[2], buckets, strict=True)]
                for key, count in body["f"].items():
                    name, outcome = key.split("\t", 1)
                    k = (queue, name, outcome)
                    self.finished[k] = self.finished.get(k, 0) + int(count)
        except (ValueError, KeyError, TypeError):
            return

    def copy(self) -> tuple[dict[tuple[str, str], list[Any]], dict[tuple[str, str], list[Any]],
                            dict[tuple[str, str, str], int]]:
        with self.lock:
            return ({k: [v[0], v[1], list(v[2])] for k, v in self.duration.items()},
                    {k: [v[0], v[1], list(v[2])] for k, v in self.pickup.items()},
                    dict(self.finished))
