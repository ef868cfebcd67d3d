"""Cost of metrics on the supervisor's no-op drain: metrics on against metrics off.

    .venv/bin/python bench/metrics_cost.py                 # 50,000 jobs, 1 process, 3 runs
    .venv/bin/python bench/metrics_cost.py --jobs 100000 --processes 2 --runs 5 --json -

One private server for the whole benchmark. Each run: the queue flushed, the jobs
bulk-admitted, then the supervisor started with ``--processes N`` (handler
``handlers:noop``) and the clock run from the first completed job to the last (as in
bench/drain.py).

- **on**: the stock ``echomq-supervisor start`` with ``--health-port``, and /metrics
  scraped every ``--scrape-s`` seconds while it drains (the consumers fold every job
  into the histograms and send them over their pipes; the parent merges them and
  serves them).
- **unserved** (with ``--modes on,unserved,off``): the stock supervisor without a
  health port: the consumers fold and send, nothing is served or scraped.
- **off**: ``bench/supervisor_bare.py`` (the same supervisor with the consumers'
  ``Observations.fold`` taken away, since the supervisor has no switch),
  no health port, nothing scraped.

Besides jobs/s (wall time, which other load on a shared machine swings by ±50 %), the
CPU time the supervisor's process tree (the parent and its consumers, user + system)
spent per job between the first completed job and the last: the cost metrics add to
each job, which other load disturbs far less.

The two alternate within each run, the order swapped from run to run, so drift in the
machine's load falls on all. Reported: jobs/s min–max per setting, and the cost
(1 − setting/off) on the medians and on the best runs (other load only ever slows a run).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.request
from typing import Any

import benchlib as bl
import psutil
from echomq.supervisor.drills.localredis import free_port

import echomq

BARE = bl.BENCH_DIR / "supervisor_bare.py"


def _scraper(port: int, every_s: float, stop: threading.Event, seen: list[int]) -> None:
    url = f"http://127.0.0.1:{port}/metrics"
    while not stop.wait(every_s):  # a scrape interval, as Prometheus keeps one
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = resp.read()
            seen.append(body.count(b"echomq_job_duration_seconds_count"))
        except OSError:
            continue  # not listening yet


def _tree_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = 0.0
    root = psutil.Process(pid)
    for p in (root, *root.children(recursive=True)):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _drain(done: Any, total: int, pid: int, timeout: float) -> tuple[float, float]:
    """Wait for the drain (the benchmark's own poll, 5 ms); (jobs/s, CPU µs per job) from
    the first completed job to the last."""
    deadline = time.monotonic() + timeout
    start: tuple[float, float, int] | None = None
    while True:
        n = done()
        if start is None and n > 0:
            start = (time.perf_counter(), _tree_cpu(pid), n)
        if n >= total:
            end = (time.perf_counter(), _tree_cpu(pid), n)
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"drain timed out after {timeout:.0f}s at {n}/{total}")
        time.sleep(0.005)
    assert start is not None
    jobs = max(1, end[2] - start[2])
    return jobs / max(end[0] - start[0], 1e-9), (end[1] - start[1]) / jobs * 1e6


def one_run(url: str, mode: str, jobs: int, processes: int, scrape_s: float,
            timeout: float) -> tuple[float, float]:
    r = bl.client(url)
    r.flushall()
    name = bl.unique_queue("metrics")
    q = echomq.Queue(name, redis=r)
    bl.admit_noop(q, jobs)
    stop, seen = threading.Event(), []
    scraper = None
    if mode == "unserved":
        proc = bl.start_supervisor(url, name, "handlers:noop", processes)
    elif mode == "on":
        port = free_port()
        proc = bl.start_supervisor(url, name, "handlers:noop", processes,
                                   extra=["--health-port", str(port),
                                          "--health-host", "127.0.0.1"])
        scraper = threading.Thread(target=_scraper, args=(port, scrape_s, stop, seen),
                                   daemon=True)
        scraper.start()
    else:
        argv = bl.supervisor_argv(url, name, "handlers:noop", processes)
        start = argv.index("start")
        proc = bl.Proc([sys.executable, str(BARE), *argv[start:]],
                       env={"BENCH_REDIS_URL": url}, tag="supervisor-bare")
    try:
        rate, cpu_us = _drain(lambda: bl.completed(r, name), jobs, proc.pid, timeout)
    finally:
        stop.set()
        proc.stop()
        if scraper is not None:
            scraper.join()
    counts = q.counts()
    if counts["completed"] != jobs or counts["waiting"] or counts["active"]:
        raise RuntimeError(f"unexpected counts after drain: {counts}")
    if mode == "on" and scrape_s < jobs / rate and not any(seen):
        raise RuntimeError("metrics on, yet no scrape showed a job duration")
    r.close()
    return rate, cpu_us


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scrape-s", type=float, default=1.0, help="seconds between scrapes")
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--modes", default="on,off", help="on, unserved, off; comma-separated")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    timeout = args.timeout or max(120.0, args.jobs / 500)
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"on", "unserved", "off"} or not {"on", "off"} <= set(modes):
        ap.error("--modes takes on and off, and optionally unserved")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpus: dict[str, list[float]] = {m: [] for m in modes}
    with bl.private_redis() as server:
        for run in range(args.runs):
            for mode in (modes if run % 2 == 0 else modes[::-1]):
                rate, cpu_us = one_run(server.url, mode, args.jobs, args.processes,
                                       args.scrape_s, timeout)
                rates[mode].append(rate)
                cpus[mode].append(cpu_us)
                print(f"  run {run + 1}: metrics {mode}: {rate:,.0f} jobs/s, "
                      f"{cpu_us:.1f} µs CPU per job", file=sys.stderr)
    stats = {m: bl.summary(rates[m]) for m in modes}
    cpu = {m: bl.summary(cpus[m]) for m in modes}
    off, cpu_off = stats["off"], cpu["off"]
    bl.print_table(f"Metrics on the supervisor's no-op drain: {args.jobs:,} jobs, "
                   f"{args.processes} process(es), {args.runs} interleaved run(s) each",
                   ["metrics", "jobs/s min–max", "cost (median jobs/s)", "CPU µs/job min–max",
                    "cost (median CPU/job)", "cost (least CPU/job)"],
                   [[m, f"{min(rates[m]):,.0f}–{max(rates[m]):,.0f}",
                     f"{100 * (1 - stats[m]['median'] / off['median']):+.1f} %",
                     f"{min(cpus[m]):.1f}–{max(cpus[m]):.1f}",
                     f"{100 * (cpu[m]['median'] / cpu_off['median'] - 1):+.1f} %",
                     f"{100 * (cpu[m]['min'] / cpu_off['min'] - 1):+.1f} %"] for m in modes])
    result: dict[str, Any] = {"bench": "metrics_cost", "jobs": args.jobs,
                              "processes": args.processes, "scrape_s": args.scrape_s,
                              "jobs_per_s": stats, "cpu_us_per_job": cpu, "runs": rates,
                              "cpu_runs": cpus}
    bl.emit_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
