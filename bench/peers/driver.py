"""Run one workload for one system and print its result as one JSON line.

    <venv>/bin/python bench/peers/driver.py --system rq --workload drain \
        --redis-url redis://127.0.0.1:PORT/0 --processes 2 --jobs 20000

Started by ``run.py`` with the virtualenv that has the system installed (EchoMQ:
the repository's .venv; arq: its own, because it pins redis<6). The database is
flushed first. Workers are the system's own command-line workers (see each
``peer_<system>.py``), started in their own sessions and killed with their
process group at the end. Every handler either appends one byte to a count
file (no-op jobs: the driver reads the file size as "completed", the same way
for every system) or pushes its start time minus ``t`` onto ``bench:lat``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import benchlib as bl  # noqa: E402
import peerlib  # noqa: E402
import redis  # noqa: E402

OWN_COMMANDS = ("config|resetstat", "config", "info", "flushall")


class Workers:
    """The system's worker processes for one workload."""

    def __init__(self, mod: ModuleType, processes: int, url: str, purpose: str,
                 count_file: str, concurrency: int = 0) -> None:
        env = {"BENCH_REDIS_URL": url, "BENCH_COUNT_FILE": count_file,
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        if peerlib.store_results():
            env["BENCH_STORE_RESULTS"] = "1"
        env.update(getattr(mod, "worker_env", lambda purpose: {})(purpose))
        if concurrency:
            env["BENCH_CONCURRENCY"] = str(concurrency)
            # the argv below reads it too (--threads, -w, --concurrency), in this process
            os.environ["BENCH_CONCURRENCY"] = str(concurrency)
        self.launched = time.perf_counter()
        # same process group as the driver: run.py kills that group if the driver times out
        self.procs = [bl.Proc(argv, env=env, cwd=HERE, tag=f"{mod.NAME}-worker",
                              own_session=False)
                      for argv in mod.worker_argvs(processes, url, purpose)]

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs)

    def tail(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"a worker exited early:\n{self.tail()}")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the workers' process trees, children
        already reaped included (RQ's forking worker)."""
        import psutil

        total = 0.0
        for p in self.procs:
            try:
                top = psutil.Process(p.pid)
                t = top.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
                for c in top.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        ct = c.cpu_times()
                        total += ct.user + ct.system
            except psutil.Error:
                pass
        return total

    def stop(self) -> None:
        # note the whole tree first: a pool child whose master exits is re-parented
        tree = [c for p in self.procs for c in bl._descendants(p.pid)]
        for p in self.procs:  # signal all first: they drain in parallel
            if p.alive():
                p.popen.terminate()
        for p in self.procs:
            p.stop(timeout=10)
        for c in tree:
            with contextlib.suppress(Exception):
                c.kill()


def server_cpu_s(r: redis.Redis) -> float:
    """The server's own CPU seconds so far (INFO cpu: user + sys, main thread and others)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def file_count(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def fill(mod: ModuleType, prod: Any, n: int, lanes: int = 1, kind: str = "noop") -> float:
    """Queue n jobs of a kind the fastest way the system offers; returns jobs/s."""
    t0 = time.perf_counter()
    if kind != "noop":
        prod.fill_kind(n, kind)
    elif lanes > 1:
        prod.enqueue_bulk_lanes(n, lanes)
    elif getattr(mod, "BULK", False):
        prod.enqueue_bulk(n)
    elif hasattr(prod, "fill"):
        prod.fill(n)
    else:
        for _ in range(n):
            prod.enqueue("noop")
    return n / (time.perf_counter() - t0)


def warm_up(prod: Any, r: redis.Redis, workers: Workers, timeout: float = 60.0) -> None:
    """One recorded job through the workers: they are up and connected."""
    prod.enqueue("record", time.time())
    deadline = time.monotonic() + timeout
    while r.llen(peerlib.LAT_KEY) < 1:
        workers.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"warm-up job not run in {timeout:.0f}s:\n{workers.tail()}")
        time.sleep(0.02)
    r.delete(peerlib.LAT_KEY)


def collect(r: redis.Redis, n: int, timeout: float, workers: Workers) -> list[float]:
    deadline = time.monotonic() + timeout
    while r.llen(peerlib.LAT_KEY) < n:
        workers.check()
        if time.monotonic() > deadline:
            got = r.llen(peerlib.LAT_KEY)
            raise TimeoutError(f"only {got}/{n} jobs started within {timeout:.0f}s")
        time.sleep(0.02)
    return [float(x) for x in r.lrange(peerlib.LAT_KEY, 0, -1)]


# --- workloads ------------------------------------------------------------------------------

def w_drain(mod: ModuleType, r: redis.Redis, a: argparse.Namespace) -> dict[str, Any]:
    if a.kind not in peerlib.KINDS:
        raise SystemExit(f"unknown kind {a.kind!r}: one of {', '.join(peerlib.KINDS)}")
    prod = mod.Producer(a.redis_url)
    fill_rate = fill(mod, prod, a.jobs, a.lanes, a.kind)
    prod.close()
    purpose = "io" if a.kind == "io" else "drain"
    workers = Workers(mod, a.processes, a.redis_url, purpose, a.count_file, a.concurrency)
    try:
        deadline = time.monotonic() + a.max_s + 120  # the extra: worker start-up
        first_t = first_n = None
        cpu0 = srv0 = 0.0
        n = 0
        while True:
            n = file_count(a.count_file)
            now = time.perf_counter()
            if first_t is None and n > 0:
                first_t, first_n = now, n
                cpu0, srv0 = workers.cpu_s(), server_cpu_s(r)
            if n >= a.jobs or (first_t is not None and now - first_t >= a.max_s):
                cpu1, srv1 = workers.cpu_s(), server_cpu_s(r)
                n = file_count(a.count_file)  # the jobs the CPU readings cover
                now = time.perf_counter()
                break
            workers.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"drain: {n}/{a.jobs} after the deadline")
            time.sleep(0.005)
    finally:
        workers.stop()
    assert first_t is not None and first_n is not None
    elapsed = max(now - first_t, 1e-9)
    jobs = max(n - first_n, 1)
    return {"rate": (n - first_n) / elapsed, "done": n, "complete": n >= a.jobs,
            # CPU per job over the same window: steadier than a rate on a shared machine
            "worker_cpu_us": (cpu1 - cpu0) / jobs * 1e6,
            "server_cpu_us": (srv1 - srv0) / jobs * 1e6,
            "cpu_us": (cpu1 - cpu0 + srv1 - srv0) / jobs * 1e6,
            "drain_s": elapsed, "boot_s": first_t - workers.launched, "fill_rate": fill_rate}


def w_enqueue(mod: ModuleType, r: redis.Redis, a: argparse.Namespace) -> dict[str, Any]:
    prod = mod.Producer(a.redis_url)
    prod.enqueue("noop")  # connect, load scripts
    lat = []
    clock = time.perf_counter
    s0, c0, t0 = server_cpu_s(r), time.process_time(), clock()
    for _ in range(a.jobs):
        t = clock()
        prod.enqueue("noop")
        lat.append(clock() - t)
    elapsed, cpu, srv = clock() - t0, time.process_time() - c0, server_cpu_s(r) - s0
    one = a.jobs / elapsed
    r.flushall()
    bulk = None
    if getattr(mod, "BULK", False) and a.bulk_jobs:
        t0 = time.perf_counter()
        prod.enqueue_bulk(a.bulk_jobs)
        bulk = a.bulk_jobs / (time.perf_counter() - t0)
    prod.close()
    return {"one_rate": one, "bulk_rate": bulk, "p50_ms": bl.pct(lat, 50) * 1000,
            "p99_ms": bl.pct(lat, 99) * 1000,
            # the producer's own CPU (all its threads) and the server's, per add
            "client_cpu_us": cpu / a.jobs * 1e6, "server_cpu_us": srv / a.jobs * 1e6}


def w_pickup(mod: ModuleType, r: redis.Redis, a: argparse.Namespace) -> dict[str, Any]:
    prod = mod.Producer(a.redis_url)
    workers = Workers(mod, a.processes, a.redis_url, "pickup", a.count_file)
    try:
        warm_up(prod, r, workers)
        time.sleep(1.5)
        gap = a.gap_ms / 1000
        nxt = time.perf_counter()
        for _ in range(a.jobs):
            prod.enqueue("record", time.time())
            nxt += gap
            time.sleep(max(0.0, nxt - time.perf_counter()))
        lat = collect(r, a.jobs, 60, workers)
    finally:
        workers.stop()
        prod.close()
    return {"p50_ms": bl.pct(lat, 50) * 1000, "p99_ms": bl.pct(lat, 99) * 1000,
            "max_ms": max(lat) * 1000}


def w_idle(mod: ModuleType, r: redis.Redis, a: argparse.Namespace) -> dict[str, Any]:
    prod = mod.Producer(a.redis_url)
    workers = Workers(mod, a.processes, a.redis_url, "idle", a.count_file)
    try:
        warm_up(prod, r, workers)
        time.sleep(2.0)
        r.config_resetstat()
        t0 = time.perf_counter()
        time.sleep(a.seconds)
        stats = bl.commandstats(r)
        elapsed = time.perf_counter() - t0
        workers.check()
    finally:
        workers.stop()
        prod.close()
    calls = {k: v for k, v in stats.items() if k not in OWN_COMMANDS}
    return {"per_s": sum(calls.values()) / elapsed,
            "by_command": {k: round(v / elapsed, 2) for k, v in sorted(calls.items())}}


def w_delayed(mod: ModuleType, r: redis.Redis, a: argparse.Namespace) -> dict[str, Any]:
    import random

    rng = random.Random(a.seed)
    prod = mod.Producer(a.redis_url)
    workers = Workers(mod, a.processes, a.redis_url, "delayed", a.count_file)
    try:
        warm_up(prod, r, workers)
        time.sleep(1.5)
        for _ in range(a.jobs):
            d = round(rng.uniform(0.3, 3.0), 3)
            prod.enqueue_delayed(time.time() + d, d)
        lat = collect(r, a.jobs, 60, workers)
    finally:
        workers.stop()
        prod.close()
    return {"p50_ms": bl.pct(lat, 50) * 1000, "p99_ms": bl.pct(lat, 99) * 1000,
            "max_ms": max(lat) * 1000, "min_ms": min(lat) * 1000}


def w_delayed_memory(mod: ModuleType, r: redis.Redis, a: argparse.Namespace) -> dict[str, Any]:
    prod = mod.Producer(a.redis_url)
    prod.enqueue_delayed(time.time() + 7200, 7200)  # keys, scripts, connections
    base = int(r.info("memory")["used_memory"])
    delays = [60.0 + i % 3600 for i in range(a.jobs)]
    t0 = time.perf_counter()
    prod.fill_delayed(delays)
    elapsed = time.perf_counter() - t0
    used = int(r.info("memory")["used_memory"])
    prod.close()
    return {"admit_rate": a.jobs / elapsed, "admit_s": elapsed,
            "delta_mb": (used - base) / 2**20, "bytes_per_job": (used - base) / a.jobs}


WORKLOADS = {"drain": w_drain, "enqueue": w_enqueue, "pickup": w_pickup, "idle": w_idle,
             "delayed": w_delayed, "delayed_memory": w_delayed_memory}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--bulk-jobs", type=int, default=20_000)
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--max-s", type=float, default=60.0, help="drain: stop measuring after this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", default="noop", help="drain: " + ", ".join(peerlib.KINDS))
    ap.add_argument("--concurrency", type=int, default=0,
                    help="in-flight jobs per worker process (0: the system's default)")
    a = ap.parse_args()
    os.environ["BENCH_REDIS_URL"] = a.redis_url
    if a.workload == "drain" and a.kind == "payload":  # results kept by every system
        os.environ["BENCH_STORE_RESULTS"] = "1"
    fd, a.count_file = tempfile.mkstemp(prefix="bench-count-")
    os.close(fd)
    os.environ["BENCH_COUNT_FILE"] = a.count_file
    try:
        mod = importlib.import_module(f"peer_{a.system}")
        r = redis.Redis.from_url(a.redis_url, socket_timeout=60)
        r.flushall()
        r.config_resetstat()
        out = WORKLOADS[a.workload](mod, r, a)
        r.flushall()
    finally:
        os.unlink(a.count_file)
    print(json.dumps({"system": a.system, "workload": a.workload, "processes": a.processes,
                      "jobs": a.jobs, "kind": a.kind, **out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
