"""Round trip add → result through the supervisor on an idle queue, p50/p99.

    .venv/bin/python bench/result_roundtrip.py                 # 300 round trips, 1 process
    .venv/bin/python bench/result_roundtrip.py --processes 1,4 --json -

A task (``bench_tasks.echo``) runs under ``echomq-supervisor start --tasks``.
Each round trip is ``echo.send(i)`` then ``echo.result(id)`` from one thread,
one after the other, so every job meets a parked supervisor (an idle queue):
admit rings the wake list, the metronome pokes a consumer, which claims, runs
and settles; the settle rings the job's doorbell and the waiter reads the value.
Also reported: the wake-up alone (result() returning after the settle), from
``Queue.result`` in a thread with the settle done by hand.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import threading
import time
from typing import Any

import benchlib as bl

import echomq
from echomq.lanes import Lanes, Outcome


def roundtrips(processes: int, count: int, beat_ms: int | None) -> list[float]:
    with bl.private_redis() as server:
        queue = bl.unique_queue("rt")
        os.environ["BENCH_TASKS_QUEUE"] = queue
        import bench_tasks

        bench_tasks = importlib.reload(bench_tasks)  # registered on this run's queue

        argv = bl.supervisor_argv(server.url, queue, "", processes, beat_ms=beat_ms)
        i = argv.index("--handler")
        argv[i:i + 2] = ["--tasks", "bench_tasks"]
        proc = bl.Proc(argv, env={"BENCH_TASKS_QUEUE": queue}, tag="supervisor")
        echomq.configure(redis_url=server.url)
        echo = bench_tasks.echo
        try:
            for w in range(3):  # warm-up: every consumer up, scripts loaded
                assert echo.result(echo.send(w), timeout=30) == w
            time.sleep(1.0)  # let the consumers report idle and park
            out = []
            for n in range(count):
                t0 = time.perf_counter()
                jid = echo.send(n)
                value = echo.result(jid, timeout=10)
                out.append(time.perf_counter() - t0)
                assert value == n
        finally:
            proc.stop()
            echomq.configure(redis_url=None)
    return out


def wakeups(count: int) -> list[float]:
    """result() returning − settle returning, for a waiter parked before the settle."""
    with bl.private_redis() as server:
        r = bl.client(server.url)
        q = echomq.Queue(bl.unique_queue("wake"), redis_url=server.url)
        lanes = Lanes(q.redis, q.keys, q.settings)
        out = []
        for n in range(count):
            jid = q.add("x", n)
            done: list[float] = []
            t = threading.Thread(target=lambda jid=jid, done=done: (q.result(jid, timeout=10),
                                                         done.append(time.perf_counter())))
            t.start()
            bl.wait_until(lambda: int(r.info("clients")["blocked_clients"]) >= 1, 5, 0.001)
            [c] = lanes.claim(1)
            lanes.settle([Outcome(c.id, c.token, "c", str(n))])
            settled = time.perf_counter()
            t.join()
            out.append(max(0.0, done[0] - settled))
        q.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--processes", default="1", help="supervisor process counts, comma-separated")
    ap.add_argument("--beat-ms", type=int, default=None)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for procs in [int(p) for p in args.processes.split(",") if p]:
        lat = roundtrips(procs, args.count, args.beat_ms)
        results.append({"what": "add → result via supervisor", "processes": procs,
                        "p50_ms": bl.pct(lat, 50) * 1000, "p99_ms": bl.pct(lat, 99) * 1000,
                        "max_ms": max(lat) * 1000, "samples": len(lat)})
        print(f"  supervisor ×{procs}: p50 {results[-1]['p50_ms']:.2f} ms", file=sys.stderr)
    wake = wakeups(min(args.count, 200))
    results.append({"what": "wake-up after settle", "processes": 0,
                    "p50_ms": statistics.median(wake) * 1000, "p99_ms": bl.pct(wake, 99) * 1000,
                    "max_ms": max(wake) * 1000, "samples": len(wake)})
    for x in results:
        rows.append([x["what"], x["processes"] or "-", f"{x['p50_ms']:.2f}", f"{x['p99_ms']:.2f}",
                     f"{x['max_ms']:.2f}", x["samples"]])
    bl.print_table("EchoMQ result round trip on an idle queue",
                   ["measure", "procs", "p50 ms", "p99 ms", "max ms", "n"], rows)
    bl.emit_json(args.json, {"bench": "result_roundtrip", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
