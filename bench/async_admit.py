"""Async admit rate from one event loop: 100 concurrent producers awaiting ``add``.

    .venv/bin/python bench/async_admit.py                   # 20,000 jobs, 100 producers
    .venv/bin/python bench/async_admit.py --jobs 50000 --producers 100,500 --json -

Each producer is a coroutine that awaits ``aq.add(...)`` (``echomq.aio.Queue``)
or ``task.asend(...)`` in a loop until the shared count is reached; all run on
one event loop in this process, against a private server. The rate is jobs
admitted per second of wall time; every job is checked to be on its lane once.
For scale, the same count through one thread of sync ``Queue.add``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import benchlib as bl

import echomq


async def _producers(send: Any, jobs: int, producers: int) -> float:
    left = iter(range(jobs))

    async def producer() -> None:
        for n in left:
            await send(n)

    t0 = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    return time.perf_counter() - t0


def one_run(mode: str, jobs: int, producers: int) -> float:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        queue = bl.unique_queue("admit")
        if mode == "sync Queue.add (1 thread)":
            q = echomq.Queue(queue, redis_url=server.url)
            t0 = time.perf_counter()
            for n in range(jobs):
                q.add("job", {"n": n})
            elapsed = time.perf_counter() - t0
            q.close()
        elif mode == "aio.Queue.add":
            async def main() -> float:
                aq = echomq.aio.Queue(queue, redis_url=server.url)
                try:
                    return await _producers(lambda n: aq.add("job", {"n": n}), jobs, producers)
                finally:
                    await aq.close()

            elapsed = asyncio.run(main())
        else:
            @echomq.task(queue=queue, name=f"{queue}.job")
            def job(n: int) -> None: ...

            echomq.configure(redis_url=server.url)
            try:
                elapsed = asyncio.run(_producers(job.asend, jobs, producers))
            finally:
                echomq.configure(redis_url=None)
        admitted = r.llen(f"emq:{{{queue}}}:lane:default")
        assert admitted == jobs, (mode, admitted, jobs)
    return jobs / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--producers", default="100", help="concurrent producers, comma-separated")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    configs = [(m, int(p)) for p in args.producers.split(",") if p
               for m in ("aio.Queue.add", "task.asend")]
    configs.append(("sync Queue.add (1 thread)", 1))
    for mode, producers in configs:
        rates = [one_run(mode, args.jobs, producers) for _ in range(args.runs)]
        results.append({"mode": mode, "producers": producers, "jobs": args.jobs,
                        "jobs_per_s": bl.summary(rates)})
        print(f"  {mode} ×{producers}: {bl.fmt_range(results[-1]['jobs_per_s'])} jobs/s",
              file=sys.stderr)
    bl.print_table(f"EchoMQ async admit, {args.jobs:,} jobs from one event loop, "
                   f"median (min–max) of {args.runs} run(s)",
                   ["producer", "concurrent", "jobs/s"],
                   [[x["mode"], x["producers"], bl.fmt_range(x["jobs_per_s"])] for x in results])
    bl.emit_json(args.json, {"bench": "async_admit", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
