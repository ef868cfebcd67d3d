"""I/O-bound drain: jobs whose handler waits 50 ms, drained by N processes with concurrency C.

    .venv/bin/python bench/io_bound.py                          # 20,000 jobs, 2 procs, C=100
    .venv/bin/python bench/io_bound.py --concurrency 100,1000   # several settings in turn
    .venv/bin/python bench/io_bound.py --mode threads           # sync handler, a thread pool
    .venv/bin/python bench/io_bound.py --runs 3 --json -
    .venv/bin/python bench/io_bound.py --observe                # where the rest of the time goes
    .venv/bin/python bench/io_bound.py --loop asyncio,uvloop    # both event loops, interleaved

Each run: a fresh private server, the jobs bulk-admitted, then ``echomq-supervisor start
--processes N --concurrency C`` with ``handlers:io_async`` (``asyncio.sleep``) or
``handlers:io_sync`` (``time.sleep`` in threads). The clock starts at the first completed
job and stops when all are completed. The ideal rate is N × C / wait. While the drain
runs, a probe job is admitted on a lane of its own every 20 ms; its pickup latency
(admit to handler start) is reported as p50/p99.

With ``--observe`` (async only) the handler also measures, in each process, how long its
50 ms waits really took (the event loop's lag included: the rate can be at most
wait / run time of the ideal) and the share of its C slots busy running a job over its
drain (the rest idled between jobs); both are averaged over the processes.

``--loop`` sets ``ECHOMQ_EVENT_LOOP`` for the consumers (default: ``auto``, uvloop when
installed); several kinds run interleaved, run by run, on one server build.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

import benchlib as bl

import echomq


def one_run(mode: str, processes: int, concurrency: int, jobs: int, wait_s: float,
            timeout: float, observe: bool = False, loop: str = "auto") -> dict[str, Any]:
    handler = "handlers:io_async" if mode == "async" else "handlers:io_sync"
    if observe:
        handler = "handlers:io_async_observed"
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("io")
        q = echomq.Queue(name, redis_url=server.url)
        payload = {"s": wait_s}
        for i in range(0, jobs, 5000):
            q.add_many([("io", payload)] * min(5000, jobs - i))
        launched = time.perf_counter()
        proc = bl.start_supervisor(server.url, name, handler, processes,
                                   extra=["--concurrency", str(concurrency)],
                                   env={"ECHOMQ_EVENT_LOOP": loop})
        stop_probes = threading.Event()
        probes = threading.Thread(target=_probe, args=(server.url, name, stop_probes),
                                  daemon=True)
        try:
            bl.wait_until(lambda: bl.completed(r, name) > 0, 60, 0.005, "the first job", proc)
            probes.start()
            res = bl.measure_drain(lambda: bl.completed(r, name) - probes_done(r), jobs,
                                   timeout, proc=proc, launched=launched)
        finally:
            stop_probes.set()
            if probes.is_alive():
                probes.join(5)
            proc.stop()
        lat = [float(x) for x in r.lrange(bl.LAT_KEY, 0, -1)]
        q.close()
        res["ideal"] = processes * concurrency / wait_s
        res["pickup_p50_ms"] = bl.pct(lat, 50) * 1000
        res["pickup_p99_ms"] = bl.pct(lat, 99) * 1000
        res["probes"] = len(lat)
        if observe:
            seen = [r.hgetall(k) for k in r.keys("bench:io:*")]
            seen = [{k.decode(): float(v) for k, v in h.items()} for h in seen]
            res["run_ms"] = sum(h["ran_s"] / h["jobs"] for h in seen) / len(seen) * 1000
            res["slots_busy"] = sum(h["busy_s"] / (concurrency * h["window_s"])
                                    for h in seen) / len(seen)
        return res


def probes_done(r: Any) -> int:
    return int(r.llen(bl.LAT_KEY))


def _probe(url: str, name: str, stop: threading.Event) -> None:
    q = echomq.Queue(name, redis_url=url)
    while not stop.wait(0.02):  # one probe every 20 ms while the drain runs
        q.add("probe", {"t": time.time()}, lane="probe")
    q.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--concurrency", default="100", help="comma-separated settings to run")
    ap.add_argument("--mode", choices=("async", "threads"), default="async")
    ap.add_argument("--wait-ms", type=float, default=50.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--observe", action="store_true",
                    help="also report the handlers' real run time and the slots' busy share")
    ap.add_argument("--loop", default="auto",
                    help="ECHOMQ_EVENT_LOOP kinds, interleaved: auto, asyncio, uvloop")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.loop.split(",") if k.strip()]
    if args.observe and args.mode != "async":
        ap.error("--observe measures async handlers only")
    wait_s = args.wait_ms / 1000
    results = []
    for c in (int(x) for x in args.concurrency.split(",") if x):
        timeout = max(120.0, 4 * args.jobs * wait_s / (args.processes * c))
        by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for _ in range(args.runs):
            for kind in kinds:
                by_kind[kind].append(one_run(args.mode, args.processes, c, args.jobs, wait_s,
                                             timeout, args.observe, kind))
        for kind, runs in by_kind.items():
            _summarize(results, args, c, kind, runs)
    _report(results, args)
    return 0


def _summarize(results: list[dict[str, Any]], args: argparse.Namespace, c: int, kind: str,
               runs: list[dict[str, Any]]) -> None:
    """One row of results: ``runs`` of concurrency ``c`` on event loop ``kind``."""
    ideal = runs[0]["ideal"]
    results.append({
        "mode": args.mode, "loop": kind, "processes": args.processes, "concurrency": c,
        "jobs": args.jobs, "ideal": ideal,
        "rate": bl.summary([x["rate"] for x in runs]),
        "of_ideal": bl.summary([x["rate"] / ideal for x in runs]),
        "pickup_p50_ms": bl.summary([x["pickup_p50_ms"] for x in runs]),
        "pickup_p99_ms": bl.summary([x["pickup_p99_ms"] for x in runs]),
    })
    if args.observe:
        results[-1]["run_ms"] = bl.summary([x["run_ms"] for x in runs])
        results[-1]["slots_busy"] = bl.summary([x["slots_busy"] for x in runs])
    print(f"  {args.mode} {kind} {args.processes}×{c}: "
          f"{bl.fmt_range(results[-1]['rate'])} jobs/s", file=sys.stderr)


def _report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the table and write the JSON."""
    headers = ["handler", "loop", "procs × concurrency", "jobs/s", "of ideal", "pickup p50 ms",
               "pickup p99 ms"]
    rows = [[x["mode"], x["loop"], f"{x['processes']} × {x['concurrency']}",
             bl.fmt_range(x["rate"]),
             bl.fmt_range(_percent(x["of_ideal"]), "{:.1f}%"),
             bl.fmt_range(x["pickup_p50_ms"], "{:.1f}"),
             bl.fmt_range(x["pickup_p99_ms"], "{:.1f}")] for x in results]
    if args.observe:
        headers += ["job run ms", "slots busy"]
        for row, x in zip(rows, results, strict=True):
            row += [bl.fmt_range(x["run_ms"], "{:.2f}"),
                    bl.fmt_range(_percent(x["slots_busy"]), "{:.1f}%")]
    bl.print_table(
        f"EchoMQ I/O-bound drain: {args.jobs:,} jobs waiting {args.wait_ms:g} ms, "
        f"median (min–max) of {args.runs} run(s)", headers, rows)
    bl.emit_json(args.json, {"bench": "io_bound", "results": results})


def _percent(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v * 100 if k != "runs" else v for k, v in summary.items()}


if __name__ == "__main__":
    raise SystemExit(main())
