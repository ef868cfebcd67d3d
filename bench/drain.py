"""No-op drain throughput: jobs/s with N jobs queued before the consumers start.

    .venv/bin/python bench/drain.py                   # 20,000 jobs: standalone, supervisor ×1,2,4
    .venv/bin/python bench/drain.py --jobs 1000000    # scale: a million queued
    .venv/bin/python bench/drain.py --lanes 10000     # the jobs spread over 10,000 lanes
    .venv/bin/python bench/drain.py --runs 3 --json - # median (min–max) of 3 runs, JSON too

Each run: a fresh private redis-server, the jobs bulk-admitted (``Queue.add_many``),
then either one standalone ``echomq.Consumer(...).run(burst=True)`` process or
``echomq-supervisor start --processes N`` (handler ``handlers:noop``). The clock
starts at the first completed job (process start-up is reported apart, as boot)
and stops when the queue's completed total reaches N.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import benchlib as bl

import echomq


def one_run(mode: str, processes: int, jobs: int, lanes: int, timeout: float) -> dict[str, Any]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("drain")
        q = echomq.Queue(name, redis_url=server.url)
        admit_rate = bl.admit_noop(q, jobs, lanes)
        launched = time.perf_counter()
        if mode == "standalone":
            proc = bl.start_consumer(server.url, name, "handlers:noop", burst=True)
        else:
            proc = bl.start_supervisor(server.url, name, "handlers:noop", processes)
        try:
            res = bl.measure_drain(lambda: bl.completed(r, name), jobs, timeout, proc=None,
                                   launched=launched)
        finally:
            proc.stop()
        counts = q.counts()
        if counts["completed"] != jobs or counts["waiting"] or counts["active"]:
            raise RuntimeError(f"unexpected counts after drain: {counts}")
        q.close()
        res["admit_rate"] = admit_rate
        return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--lanes", type=int, default=1, help="spread the jobs over this many lanes")
    ap.add_argument("--processes", default="1,2,4",
                    help="supervisor process counts, comma-separated")
    ap.add_argument("--no-standalone", action="store_true")
    ap.add_argument("--no-supervisor", action="store_true")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run (default: scales)")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    timeout = args.timeout or max(120.0, args.jobs / 500)
    configs: list[tuple[str, int]] = []
    if not args.no_standalone:
        configs.append(("standalone", 1))
    if not args.no_supervisor:
        configs += [("supervisor", int(p)) for p in args.processes.split(",") if p]
    results = []
    for mode, procs in configs:
        runs = [one_run(mode, procs, args.jobs, args.lanes, timeout) for _ in range(args.runs)]
        results.append({
            "mode": mode, "processes": procs, "jobs": args.jobs, "lanes": args.lanes,
            "rate": bl.summary([x["rate"] for x in runs]),
            "boot_s": bl.summary([x["boot_s"] for x in runs]),
            "wall_s": bl.summary([x["wall_s"] for x in runs]),
            "admit_rate": bl.summary([x["admit_rate"] for x in runs]),
        })
        print(f"  {mode} ×{procs}: {bl.fmt_range(results[-1]['rate'])} jobs/s", file=sys.stderr)
    bl.print_table(
        f"EchoMQ drain: {args.jobs:,} no-op jobs over {args.lanes:,} lane(s), "
        f"median (min–max) of {args.runs} run(s)",
        ["consumer", "procs", "jobs/s", "boot s", "wall s", "admit jobs/s (add_many)"],
        [[x["mode"], x["processes"], bl.fmt_range(x["rate"]), bl.fmt_range(x["boot_s"], "{:.2f}"),
          bl.fmt_range(x["wall_s"], "{:.1f}"), bl.fmt_range(x["admit_rate"])] for x in results])
    bl.emit_json(args.json, {"bench": "drain", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
