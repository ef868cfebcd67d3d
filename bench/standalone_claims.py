"""What the standalone consumer's one-job claims cost on a no-op drain.

    .venv/bin/python bench/standalone_claims.py              # 20,000 jobs, 3 rounds
    .venv/bin/python bench/standalone_claims.py --jobs 50000 --rounds 5

A standalone ``Consumer`` with a sync handler and concurrency 1 claims one job at a
time, so a job that kills its process is the only one charged a stall (nothing else
knows which job was running). This compares it, in one process on one private server,
with the same consumer claiming batches sized by the runner as it did before (up to
``claim_batch``, 16): each round drains JOBS no-op jobs admitted with ``add_many`` with
one, then the other, in alternating order. Reports jobs per wall second and per CPU
second (this process plus the server, from ``INFO cpu``), median (min–max).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import benchlib as bl

import echomq


class Batched(echomq.Consumer):
    """The standalone consumer claiming batches, as before it claimed one job at a time."""

    def batch_size(self) -> int:
        return self.runner.batch_size()


def cpu_seconds(r: Any) -> float:
    info = r.info("cpu")
    return time.process_time() + float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(url: str, r: Any, kind: type[echomq.Consumer], jobs: int) -> tuple[float, float]:
    """(jobs per wall second, jobs per CPU second) of one burst drain."""
    q = echomq.Queue(bl.unique_queue("claims"), redis_url=url)
    bl.admit_noop(q, jobs)
    consumer = kind(q, lambda job: None)
    cpu, wall = cpu_seconds(r), time.perf_counter()
    consumer.run(burst=True)
    wall, cpu = time.perf_counter() - wall, cpu_seconds(r) - cpu
    done = q.counts()["completed"]
    q.close()
    if done != jobs:
        raise SystemExit(f"the drain completed {done} of {jobs} jobs")
    return jobs / wall, jobs / cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    kinds: dict[str, type[echomq.Consumer]] = {"batches (before)": Batched,
                                                "one job (now)": echomq.Consumer}
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    with bl.private_redis() as server:
        r = bl.client(server.url)
        drain(server.url, r, echomq.Consumer, 2_000)  # warm-up: scripts loaded, imports settled
        for n in range(args.rounds):
            order = list(kinds) if n % 2 == 0 else list(reversed(kinds))
            for name in order:
                w, c = drain(server.url, r, kinds[name], args.jobs)
                wall[name].append(w)
                cpu[name].append(c)
            r.flushall()
    bl.print_table(
        f"Standalone no-op drain, {args.jobs:,} jobs: median (min–max) of {args.rounds} "
        "interleaved rounds",
        ["claims", "jobs/s", "jobs/CPU-s"],
        [[name, bl.fmt_range(bl.summary(wall[name])), bl.fmt_range(bl.summary(cpu[name]))]
         for name in kinds])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
