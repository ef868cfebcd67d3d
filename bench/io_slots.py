"""Where a concurrent consumer's slots spend their time during an I/O-bound drain.

    .venv/bin/python bench/io_slots.py                        # 10,000 jobs of 50 ms, C=100
    .venv/bin/python bench/io_slots.py --prefetch 0,25,50     # cap the buffer (0: none)
    .venv/bin/python bench/io_slots.py --json -

One standalone ``echomq.Consumer(concurrency=C)`` in this process drains jobs whose async
handler waits ``--wait-ms``. Every 2 ms a probe on the consumer's event loop samples the
slots: running, finished but not yet sent to the server, in a settle under way, being
claimed, and the jobs held in the prefetch buffer. Also reported: round-trip times, jobs
per round trip, CPU per job, and the loop's lag (how late the probe's own 2 ms timer fires,
which every job's wait suffers too). Unlike ``io_bound.py`` (the figure to quote) this
shows why the rate is what it is.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from typing import Any

import benchlib as bl

import echomq
import echomq.consumer
from echomq.concurrent import ConcurrentDrain

SAMPLE_S = 0.002


class SampledDrain(ConcurrentDrain):
    """The concurrent drain with a sampler on its loop and timed round trips."""

    cap: int | None = None
    samples: list[tuple[float, ...]] = []
    trips_seen: list[tuple[float, int, int]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if SampledDrain.cap is not None:
            self.max_prefetch = SampledDrain.cap

    async def _main(self) -> None:
        sampler = asyncio.get_running_loop().create_task(self._sample())
        try:
            await super()._main()
        finally:
            sampler.cancel()

    async def _sample(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(SAMPLE_S)
            lag = time.perf_counter() - t0 - SAMPLE_S
            self.samples.append((len(self.in_flight), len(self.done), self.settling,
                                 self.claiming, len(self.buffer), lag * 1000))

    async def _round_trip(self, outcomes: list[Any], want: int, chain: bool,
                          handback: list[tuple[str, str]]) -> None:
        t0 = time.perf_counter()
        await super()._round_trip(outcomes, want, chain, handback)
        self.trips_seen.append(((time.perf_counter() - t0) * 1000, len(outcomes), want))


def one_run(jobs: int, concurrency: int, wait_s: float, cap: int | None) -> dict[str, Any]:
    SampledDrain.cap = cap
    SampledDrain.samples = []
    SampledDrain.trips_seen = []

    async def handler(job: echomq.Job) -> None:
        await asyncio.sleep(wait_s)

    echomq.consumer.ConcurrentDrain = SampledDrain  # type: ignore[misc]
    with bl.private_redis() as server:
        q = echomq.Queue(bl.unique_queue("slots"), redis_url=server.url)
        for i in range(0, jobs, 5000):
            q.add_many([("io", {})] * min(5000, jobs - i))
        consumer = echomq.Consumer(q, handler, concurrency=concurrency)
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        ran = consumer.run(burst=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        q.close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cols = list(zip(*SampledDrain.samples, strict=True))
    rtt = sorted(t[0] for t in SampledDrain.trips_seen)
    return {
        "prefetch_cap": cap, "jobs": ran, "rate": ran / wall,
        "running": statistics.mean(cols[0]), "unsent": statistics.mean(cols[1]),
        "settling": statistics.mean(cols[2]), "claiming": statistics.mean(cols[3]),
        "buffer": statistics.mean(cols[4]), "lag_ms_mean": statistics.mean(cols[5]),
        "lag_ms_p99": bl.pct(list(cols[5]), 99),
        "trips": len(rtt), "rtt_ms_p50": bl.pct(rtt, 50), "rtt_ms_p90": bl.pct(rtt, 90),
        "jobs_per_trip": ran / max(1, len(rtt)), "cpu_us_per_job": cpu / max(1, ran) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--wait-ms", type=float, default=50.0)
    ap.add_argument("--prefetch", default="",
                    help="comma-separated caps on the buffer to run in turn (default: the "
                         "consumer's own)")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    caps: list[int | None] = [int(x) for x in args.prefetch.split(",") if x] or [None]
    results = [one_run(args.jobs, args.concurrency, args.wait_ms / 1000, cap) for cap in caps]
    c = args.concurrency
    bl.print_table(
        f"Slots of one consumer at concurrency {c}: {args.jobs:,} jobs waiting "
        f"{args.wait_ms:g} ms (mean slots over the drain)",
        ["buffer cap", "running", "unsent", "settling", "claiming", "buffered", "rtt p50/p90 ms",
         "jobs/trip", "CPU µs/job", "loop lag ms mean/p99"],
        [["default" if x["prefetch_cap"] is None else x["prefetch_cap"],
          f"{x['running']:.1f} ({x['running'] / c:.1%})", f"{x['unsent']:.1f}",
          f"{x['settling']:.1f}", f"{x['claiming']:.1f}", f"{x['buffer']:.1f}",
          f"{x['rtt_ms_p50']:.2f}/{x['rtt_ms_p90']:.2f}", f"{x['jobs_per_trip']:.1f}",
          f"{x['cpu_us_per_job']:.0f}", f"{x['lag_ms_mean']:.2f}/{x['lag_ms_p99']:.1f}"]
         for x in results])
    bl.emit_json(args.json, {"bench": "io_slots", "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
