"""Control of running work: cancel latency, the queue-wide limit's cost, debounce.

    .venv/bin/python bench/control.py                  # everything, 3 runs
    .venv/bin/python bench/control.py --only cancel    # or: limit, debounce
    PYTHONPATH=OTHER .venv/bin/python bench/control.py --only limit   # another checkout's
                                                       # claim path ("unset" mode only)

- **cancel**: the time from ``q.cancel(jid)`` returning to the handler's end, p50/p99 of
  ``--cancels`` cancels: an async handler (standalone consumer: its task's
  CancelledError; under the supervisor: the same, recorded by the handler), a sync
  handler under the supervisor (its process gone: ``psutil`` wait on its pid), a
  standalone sync handler calling ``job.progress()`` every 10 ms (its JobCancelled).
- **limit**: one in-process client claims 16 no-op jobs and settles them (settle and the
  next claim in one round trip) until 20,000 over 100 lanes are done; the server's CPU
  time per job and the commands per job, with no limit, with a queue-wide ``max_active``
  that never binds, and with a non-binding ``max_active`` plus ``rate``. Modes alternate
  within each run.
- **debounce**: 10,000 adds over 100 keys (``debounce_s`` 0.5, ``debounce_max_s`` 60) with
  a standalone consumer running: the runs (100 expected), the payloads they saw (10,000),
  the add rate, and the time from each key's last add to its run's start.
"""

from __future__ import annotations

import argparse
import asyncio
import queue as queue_mod
import statistics
import sys
import threading
import time
from typing import Any

import benchlib as bl
import psutil

import echomq
from echomq.lanes import Lanes, Outcome

MODES = ("unset", "max_active", "max_active+rate")


def _pcts(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"p50 {bl.pct(ms, 50):.1f} ms, p99 {bl.pct(ms, 99):.1f} ms (n={len(ms)})"


# --- cancel -----------------------------------------------------------------------------

def cancel_standalone_async(url: str, n: int) -> list[float]:
    q = echomq.Queue(bl.unique_queue("ctl-a"), redis_url=url)
    started: queue_mod.Queue[str] = queue_mod.Queue()
    ended: queue_mod.Queue[float] = queue_mod.Queue()

    async def handler(job: echomq.Job) -> None:
        started.put(job.id)
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            ended.put(time.perf_counter())
            raise

    consumer = echomq.Consumer(q, handler, beat_ms=200)
    t = threading.Thread(target=consumer.run, daemon=True)
    t.start()
    out = []
    for _ in range(n):
        jid = q.add("x", None)
        assert started.get(timeout=30) == jid
        t0 = time.perf_counter()
        assert q.cancel(jid)
        out.append(ended.get(timeout=30) - t0)
    consumer.stop()
    t.join(30)
    return out


def cancel_standalone_sync(url: str, n: int) -> list[float]:
    q = echomq.Queue(bl.unique_queue("ctl-s"), redis_url=url)
    started: queue_mod.Queue[str] = queue_mod.Queue()
    ended: queue_mod.Queue[float] = queue_mod.Queue()

    def handler(job: echomq.Job) -> None:
        started.put(job.id)
        try:
            for i in range(12_000):
                job.progress(i)
                time.sleep(0.01)  # simulated work between progress reports
        except echomq.JobCancelled:
            ended.put(time.perf_counter())
            raise

    consumer = echomq.Consumer(q, handler, beat_ms=200)
    t = threading.Thread(target=consumer.run, daemon=True)
    t.start()
    out = []
    for _ in range(n):
        jid = q.add("x", None)
        assert started.get(timeout=30) == jid
        t0 = time.perf_counter()
        assert q.cancel(jid)
        out.append(ended.get(timeout=30) - t0)
    consumer.stop()
    t.join(30)
    return out


def cancel_supervised(url: str, n: int, handler: str) -> list[float]:
    name = bl.unique_queue("ctl-sup")
    q = echomq.Queue(name, redis_url=url)
    r = bl.client(url)
    r.delete("bench:ctl:started", "bench:ctl:ended")
    out = []
    with bl.start_supervisor(url, name, handler, 1):
        for _ in range(n):
            jid = q.add("x", None)
            raw = r.blpop(["bench:ctl:started"], 60)
            assert raw is not None, "the job did not start"
            got, pid = raw[1].decode().rsplit(":", 1)
            assert got == jid
            proc = psutil.Process(int(pid))
            t0 = time.perf_counter()
            w0 = time.time()
            assert q.cancel(jid)
            if handler.endswith("block"):
                proc.wait(30)  # the process is gone: the handler with it
                out.append(time.perf_counter() - t0)
            else:
                ended = r.blpop(["bench:ctl:ended"], 30)
                assert ended is not None, "the task was not cancelled"
                out.append(float(ended[1]) - w0)
    return out


def bench_cancel(runs: int, n: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {"async, standalone": [], "async, supervisor": [],
                                   "sync, supervisor (process ended)": [],
                                   "sync, standalone (next progress, 10 ms chunks)": []}
    for _ in range(runs):
        with bl.private_redis() as server:
            got["async, standalone"] += cancel_standalone_async(server.url, n)
            got["async, supervisor"] += cancel_supervised(server.url, n,
                                                          "control_handlers:wait")
            got["sync, supervisor (process ended)"] += cancel_supervised(
                server.url, n, "control_handlers:block")
            got["sync, standalone (next progress, 10 ms chunks)"] += \
                cancel_standalone_sync(server.url, n)
    bl.print_table("cancel -> handler ended", ["handler", "latency"],
                   [[k, _pcts(v)] for k, v in got.items()])
    return got


# --- queue-wide limit -------------------------------------------------------------------

def server_cpu(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def limit_run(mode: str, jobs: int, lanes: int) -> dict[str, float]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        q = echomq.Queue(bl.unique_queue("ctl-limit"), redis_url=server.url)
        if mode == "max_active":
            q.set_queue_limit(max_active=1_000_000)
        elif mode == "max_active+rate":
            q.set_queue_limit(max_active=1_000_000, rate=1_000_000, per_s=1)
        bl.admit_noop(q, jobs, lanes)
        claimer = Lanes(q.redis, q.keys, q.settings)
        r.config_resetstat()
        cpu0 = server_cpu(r)
        t0 = time.perf_counter()
        done = 0
        batch = claimer.claim(16)
        while batch:
            done += len(batch)
            _, batch = claimer.settle_and_claim([Outcome(c.id, c.token, "c") for c in batch], 16)
        elapsed = time.perf_counter() - t0
        cpu = server_cpu(r) - cpu0
        if done != jobs:
            raise RuntimeError(f"{mode}: claimed {done} of {jobs}")
        inner = sum(v for k, v in bl.commandstats(r).items()
                    if k not in ("evalsha", "info", "config|resetstat"))
        return {"rate": jobs / elapsed, "cpu_us": cpu / jobs * 1e6, "commands": inner / jobs}


def bench_limit(runs: int, jobs: int, lanes: int) -> dict[str, list[dict[str, float]]]:
    modes = MODES if hasattr(echomq.Queue, "set_queue_limit") else ("unset",)
    got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(runs):
        for m in modes:
            got[m].append(limit_run(m, jobs, lanes))
    rows = []
    base = statistics.median(x["cpu_us"] for x in got["unset"])
    for m, xs in got.items():
        cpu = bl.summary([x["cpu_us"] for x in xs])
        rate = bl.summary([x["rate"] for x in xs])
        rows.append([m, bl.fmt_range(cpu, "{:.2f}"), f"{cpu['median'] / base:.3f}",
                     bl.fmt_range(rate), f"{statistics.median(x['commands'] for x in xs):.2f}"])
    bl.print_table(f"claim+settle of {jobs:,} no-op jobs over {lanes} lanes (echomq from "
                   f"{echomq.__file__})", ["queue limit", "server CPU us/job", "vs unset",
                                           "jobs/s (wall)", "commands/job"], rows)
    return got


# --- debounce ---------------------------------------------------------------------------

def debounce_run(url: str, adds: int, keys: int, wait_s: float) -> dict[str, Any]:
    q = echomq.Queue(bl.unique_queue("ctl-deb"), redis_url=url)
    runs: list[tuple[str, float, int]] = []
    lock = threading.Lock()
    all_ran = threading.Event()

    def handler(job: echomq.Job) -> None:
        seen = len(job.payloads)
        with lock:
            runs.append((job.payload["k"], time.perf_counter(), seen))
            if sum(s for _, _, s in runs) >= adds:
                all_ran.set()

    consumer = echomq.Consumer(q, handler, beat_ms=100, concurrency=1)
    t = threading.Thread(target=consumer.run, daemon=True)
    t.start()
    last: dict[str, float] = {}
    t0 = time.perf_counter()
    for i in range(adds):
        k = f"k{i % keys}"
        q.add("batch", {"k": k, "i": i}, debounce=k, debounce_s=wait_s, debounce_max_s=60.0)
        last[k] = time.perf_counter()
    add_s = time.perf_counter() - t0
    all_ran.wait(120)
    consumer.stop()
    t.join(30)
    after = [start - last[k] for k, start, _ in runs]
    return {"runs": len(runs), "payloads": sum(s for _, _, s in runs), "adds_s": adds / add_s,
            "after_last": after}


def bench_debounce(runs: int) -> list[dict[str, Any]]:
    got = []
    for _ in range(runs):
        with bl.private_redis() as server:
            got.append(debounce_run(server.url, 10_000, 100, 0.5))
    bl.print_table("debounce: 10,000 adds over 100 keys, debounce_s 0.5, debounce_max_s 60",
                   ["run", "runs", "payloads seen", "adds/s", "last add -> run start"],
                   [[i + 1, g["runs"], g["payloads"], f"{g['adds_s']:,.0f}",
                     _pcts(g["after_last"])] for i, g in enumerate(got)])
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("cancel", "limit", "debounce"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cancels", type=int, default=30, help="cancels per kind per run")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--lanes", type=int, default=100)
    args = parser.parse_args(argv)
    if args.only in (None, "cancel"):
        bench_cancel(args.runs, args.cancels)
    if args.only in (None, "limit"):
        bench_limit(args.runs, args.jobs, args.lanes)
    if args.only in (None, "debounce"):
        bench_debounce(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
