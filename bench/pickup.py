"""Pickup latency on an idle queue: handler start − admit time, p50/p99.

    .venv/bin/python bench/pickup.py                  # 200 jobs, 20 ms apart
    .venv/bin/python bench/pickup.py --runs 3 --json -

The consumers start on an empty queue and park; a warm-up job makes sure they
are ready. Then jobs are admitted one by one (``Queue.add``) ``--gap-ms`` apart,
each carrying ``time.time()`` taken just before its ``add``; the handler
(``handlers:record``) pushes ``time.time() - t`` onto a Redis list as its first
action. Through the supervisor (``--processes``, default 1) and through one
standalone ``Consumer(...).run()``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import benchlib as bl

import echomq


def one_run(mode: str, processes: int, jobs: int, gap_s: float, beat_ms: int | None,
            doorbell: str = "list") -> dict[str, Any]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("pickup")
        q = echomq.Queue(name, redis_url=server.url)
        if mode == "standalone":
            proc = bl.start_consumer(server.url, name, "handlers:record", beat_ms=beat_ms,
                                     doorbell=doorbell)
        else:
            proc = bl.start_supervisor(server.url, name, "handlers:record", processes,
                                       beat_ms=beat_ms, extra=["--doorbell", doorbell])
        try:
            q.add("warmup", {"t": time.time()})
            bl.collect_latencies(r, 1, 30, proc)
            time.sleep(1.5)  # let the consumers park again
            r.delete(bl.LAT_KEY)
            nxt = time.perf_counter()
            for _ in range(jobs):
                q.add("probe", {"t": time.time()})
                nxt += gap_s
                time.sleep(max(0.0, nxt - time.perf_counter()))
            lat = bl.collect_latencies(r, jobs, 30, proc)
        finally:
            proc.stop()
        q.close()
    return {"p50_ms": bl.pct(lat, 50) * 1000, "p99_ms": bl.pct(lat, 99) * 1000,
            "max_ms": max(lat) * 1000, "samples": len(lat)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--processes", default="1", help="supervisor process counts, comma-separated")
    ap.add_argument("--beat-ms", type=int, default=None)
    ap.add_argument("--no-standalone", action="store_true")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--doorbell", default="list,marker",
                    help="doorbell kinds, side by side: list, marker or list,marker")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    configs = [("supervisor", int(p)) for p in args.processes.split(",") if p]
    if not args.no_standalone:
        configs.append(("standalone", 1))
    kinds = bl.doorbells(args.doorbell)
    plan = [(mode, procs, kind) for mode, procs in configs for kind in kinds]
    results = []
    for mode, procs, kind in plan:
        runs = [one_run(mode, procs, args.jobs, args.gap_ms / 1000, args.beat_ms, kind)
                for _ in range(args.runs)]
        results.append({"mode": mode, "processes": procs, "doorbell": kind, "jobs": args.jobs,
                        **{k: bl.summary([x[k] for x in runs])
                           for k in ("p50_ms", "p99_ms", "max_ms")}})
        print(f"  {mode} ×{procs} {kind}: p50 {bl.fmt_range(results[-1]['p50_ms'], '{:.2f}')} ms",
              file=sys.stderr)
    bl.print_table(
        f"EchoMQ pickup latency (handler start − admit), {args.jobs} jobs "
        f"{args.gap_ms:g} ms apart, median (min–max) of {args.runs} run(s)",
        ["consumer", "procs", "doorbell", "p50 ms", "p99 ms", "max ms"],
        [[x["mode"], x["processes"], x["doorbell"], bl.fmt_range(x["p50_ms"], "{:.2f}"),
          bl.fmt_range(x["p99_ms"], "{:.2f}"), bl.fmt_range(x["max_ms"], "{:.2f}")]
         for x in results])
    bl.emit_json(args.json, {"bench": "pickup", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
