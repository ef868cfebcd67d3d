"""Lateness of delayed jobs: handler start − due time, p50/p99, through the supervisor.

    .venv/bin/python bench/delayed.py                 # 200 jobs due in 0.3–3 s
    .venv/bin/python bench/delayed.py --runs 3 --standalone --json -

The consumers start on an empty queue and park. Then ``--jobs`` jobs are
admitted one by one with ``Queue.add(delay=d)``, d uniform in
[``--min-s``, ``--max-s``]; each carries ``t`` = ``time.time()`` before its add
+ d, and the handler (``handlers:record``) pushes ``time.time() - t``. The due
time is computed by the server (TIME inside the script), a fraction of a
millisecond after ``t``'s base, so lateness is over-stated by about one admit
round trip, not under-stated.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

import benchlib as bl

import echomq


def one_run(mode: str, processes: int, jobs: int, lo: float, hi: float, seed: int,
            doorbell: str = "list") -> dict[str, Any]:
    rng = random.Random(seed)
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("delayed")
        q = echomq.Queue(name, redis_url=server.url)
        if mode == "standalone":
            proc = bl.start_consumer(server.url, name, "handlers:record", doorbell=doorbell)
        else:
            proc = bl.start_supervisor(server.url, name, "handlers:record", processes,
                                       extra=["--doorbell", doorbell])
        try:
            q.add("warmup", {"t": time.time()})
            bl.collect_latencies(r, 1, 30, proc)
            time.sleep(1.5)
            r.delete(bl.LAT_KEY)
            for _ in range(jobs):
                d = round(rng.uniform(lo, hi), 3)
                q.add("probe", {"t": time.time() + d}, delay=d)
            lat = bl.collect_latencies(r, jobs, hi + 30, proc)
        finally:
            proc.stop()
        q.close()
    return {"p50_ms": bl.pct(lat, 50) * 1000, "p99_ms": bl.pct(lat, 99) * 1000,
            "max_ms": max(lat) * 1000, "min_ms": min(lat) * 1000}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--min-s", type=float, default=0.3)
    ap.add_argument("--max-s", type=float, default=3.0)
    ap.add_argument("--processes", default="1")
    ap.add_argument("--standalone", action="store_true", help="also a standalone Consumer")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--doorbell", default="list,marker",
                    help="doorbell kinds, side by side: list, marker or list,marker")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    configs = [("supervisor", int(p)) for p in args.processes.split(",") if p]
    if args.standalone:
        configs.append(("standalone", 1))
    kinds = bl.doorbells(args.doorbell)
    plan = [(mode, procs, kind) for mode, procs in configs for kind in kinds]
    results = []
    for mode, procs, kind in plan:
        runs = [one_run(mode, procs, args.jobs, args.min_s, args.max_s, seed, kind)
                for seed in range(args.runs)]
        results.append({"mode": mode, "processes": procs, "doorbell": kind, "jobs": args.jobs,
                        **{k: bl.summary([x[k] for x in runs])
                           for k in ("p50_ms", "p99_ms", "max_ms", "min_ms")}})
        print(f"  {mode} ×{procs} {kind}: p50 {bl.fmt_range(results[-1]['p50_ms'], '{:.2f}')} ms",
              file=sys.stderr)
    bl.print_table(
        f"EchoMQ delayed-job lateness (handler start − due), {args.jobs} jobs due in "
        f"{args.min_s:g}–{args.max_s:g} s, median (min–max) of {args.runs} run(s)",
        ["consumer", "procs", "doorbell", "p50 ms", "p99 ms", "max ms", "min ms"],
        [[x["mode"], x["processes"], x["doorbell"], *(bl.fmt_range(x[k], "{:.2f}")
                                      for k in ("p50_ms", "p99_ms", "max_ms", "min_ms"))]
         for x in results])
    bl.emit_json(args.json, {"bench": "delayed", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
