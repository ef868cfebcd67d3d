"""A full garbage collection in the supervisor, its start-up heap frozen or not.

    .venv/bin/python bench/supervisor_gc.py [--runs 7]

Builds the supervisor as ``echomq-supervisor start`` does (settings, a migrated SQLite
floor, the arbiter with its queue, its handler and its scheduler factory) in this
process, on a private redis-server, then times ``gc.collect()``: with the start-up heap
frozen, as the arbiter leaves it (``gc.freeze()`` before its scheduler threads start),
and unfrozen (``gc.unfreeze()``), which every full collection walked before. A full
collection holds the GIL: its time is how long the scheduler's beat (and with it the
fold of deferred jobs onto the floor) and the arbiter's loop stand still.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import benchlib as bl
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.scheduler import make_factory
from echomq.supervisor.settings import QueueSpec, Settings

from echomq.floor import Floor


def timed_collect(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with bl.private_redis() as server, tempfile.TemporaryDirectory() as tmp:
        floor_url = f"sqlite:///{Path(tmp) / 'floor.db'}"
        floor = Floor.from_url(floor_url)
        floor.upgrade()
        settings = Settings(redis_url=server.url, floor_url=floor_url, queues=(
            QueueSpec(name="gcq", handler="handlers:noop", processes=2),))
        arbiter = Arbiter(settings, floor=floor, scheduler_factory=make_factory(settings, floor))
        try:
            frozen = gc.get_freeze_count()
            with_freeze = timed_collect(args.runs)
            gc.unfreeze()
            tracked = len(gc.get_objects())
            without = timed_collect(args.runs)
        finally:
            for rt in arbiter.queues.values():
                if rt.scheduler is not None:
                    rt.scheduler.close()
            floor.dispose()
    print(f"start-up heap: {frozen:,} objects frozen; {tracked:,} tracked once unfrozen")
    for label, xs in (("frozen (as the supervisor runs)", with_freeze),
                      ("unfrozen", without)):
        print(f"gc.collect() {label}: median {statistics.median(xs):.2f} ms "
              f"(min {min(xs):.2f}, max {max(xs):.2f}) over {len(xs)} runs")


if __name__ == "__main__":
    main()
