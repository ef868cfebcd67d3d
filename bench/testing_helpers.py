"""The testing helpers' costs: the plugin's server start-up, and run_jobs on 1,000 jobs.

    python bench/testing_helpers.py [--jobs 1000] [--runs 3]

Prints the median (min-max) over the runs: wall time, and CPU time of this process (the
test's own process runs the jobs; the server's CPU is not counted).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import echomq
from echomq.testing import run_jobs
from echomq.testing.server import TestServer, remove_queue


def fmt(xs: list[float], scale: float, spec: str) -> str:
    """Median (min-max) of ``xs`` times ``scale``, each formatted with ``spec``."""
    m, lo, hi = (f"{x * scale:{spec}}" for x in (statistics.median(xs), min(xs), max(xs)))
    return f"{m} ({lo}-{hi})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    starts, walls, cpus = [], [], []
    for _ in range(args.runs):
        t = time.perf_counter()
        server = TestServer.start()  # what the echomq_server fixture does
        starts.append(time.perf_counter() - t)
        try:
            q = echomq.Queue(f"bench-{uuid.uuid4().hex[:8]}", redis_url=server.url)
            q.add_many([("noop", i) for i in range(args.jobs)])
            t, c = time.perf_counter(), time.process_time()
            jobs = run_jobs(q, lambda job: job.payload, raise_on_failure=True)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            assert len(jobs) == args.jobs
            remove_queue(q)
            q.close()
        finally:
            server.stop()
    print(f"median (min-max) over {args.runs} runs")
    print(f"echomq_server start-up (embedded Valkey): {fmt(starts, 1000, '.0f')} ms")
    print(f"run_jobs on {args.jobs} jobs: wall {fmt(walls, 1, '.3f')} s, "
          f"CPU {fmt(cpus, 1e6 / args.jobs, '.0f')} us/job")


if __name__ == "__main__":
    main()
