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

import json
import threading
import time
from bisect import bisect_left
from typing import Any

from echomq.job import Claimed

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 300.0)
PICKUP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  60.0, 300.0, 3600.0)
OUTCOMES = {"c": "completed", "f": "failed", "d": "dead"}
FLUSH_EVERY_S = 1.0


def _entry(size: int) -> list[Any]:
    return [0, 0.0, [0] * size]


class Observations:
    """The child side: jobs folded in by :meth:`fold`, handed out as an ``OBS`` line.

    Kept per (job name, outcome code): count, summed duration, duration buckets; and per
    job name for first attempts: count, summed pickup wait, pickup buckets.
    """

    def __init__(self) -> None:
        self.by_outcome: dict[tuple[str, str], list[Any]] = {}
        self.pickup: dict[str, list[Any]] = {}
        self.flushed_at = time.monotonic()
        # perf_counter -> unix seconds, refreshed at each flush (pickup needs wall time)
        self.wall_offset = time.time() - time.perf_counter()

    def fold(self, claimed: Claimed, code: str, t0: float, elapsed: float) -> None:
        """Fold one job in (a :data:`echomq.runner.Observer`): its outcome ``code``, its
        start ``t0`` (perf_counter) and run time. On the hot path of every job, so flat:
        two dict look-ups and two bisects (well under a microsecond)."""
        key = (claimed.name, code)
        entry = self.by_outcome.get(key)
        if entry is None:
            entry = self.by_outcome[key] = _entry(len(DURATION_BUCKETS) + 1)
        entry[0] += 1
        entry[1] += elapsed
        entry[2][bisect_left(DURATION_BUCKETS, elapsed)] += 1
        if claimed.attempts == 1 and claimed.created_ms:
            # admission to first start: the host's clock against the server's, so clamped
            wait = t0 + self.wall_offset - claimed.created_ms / 1000
            wait = wait if wait > 0.0 else 0.0
            p = self.pickup.get(claimed.name)
            if p is None:
                p = self.pickup[claimed.name] = _entry(len(PICKUP_BUCKETS) + 1)
            p[0] += 1
            p[1] += wait
            p[2][bisect_left(PICKUP_BUCKETS, wait)] += 1

    def line(self, force: bool = False) -> bytes | None:
        """The pending observations as one line (and forget them), or None."""
        if not self.by_outcome or (not force and
                                   time.monotonic() - self.flushed_at < FLUSH_EVERY_S):
            return None
        duration: dict[str, list[Any]] = {}
        finished: dict[str, int] = {}
        for (name, code), (count, total, buckets) in self.by_outcome.items():
            d = duration.setdefault(name, _entry(len(buckets)))
            d[0] += count
            d[1] += total
            d[2] = [a + b for a, b in zip(d[2], buckets, strict=True)]
            finished[f"{name}\t{OUTCOMES.get(code, code)}"] = count
        body = {"d": duration, "p": dict(self.pickup), "f": finished}
        self.by_outcome = {}
        self.pickup = {}
        self.flushed_at = time.monotonic()
        self.wall_offset = time.time() - time.perf_counter()
        return b"OBS " + json.dumps(body, separators=(",", ":")).encode() + b"\n"


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
        """A consistent copy of the duration, pickup and finished counts."""
        with self.lock:
            return ({k: [v[0], v[1], list(v[2])] for k, v in self.duration.items()},
                    {k: [v[0], v[1], list(v[2])] for k, v in self.pickup.items()},
                    dict(self.finished))
