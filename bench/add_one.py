"""One-by-one adds: jobs/s, per-call latency (p50/p99) and CPU per add, client and server,
for ``Queue.add``, ``aio.Queue.add`` and the peers' enqueue, interleaved in one run.

    .venv/bin/python bench/add_one.py                       # 10,000 adds, 3 runs, EchoMQ
    .venv/bin/python bench/add_one.py --peers huey,rq       # + their enqueue, same server
    .venv/bin/python bench/add_one.py --jobs 20000 --runs 5 --json -

Each add is awaited before the next is sent (a web request enqueuing one job), on one
private server flushed between measurements; runs are interleaved (run 1 of every system,
then run 2) so drift in the machine's load falls on all alike. Client CPU is the
producer process's own (``time.process_time``), server CPU the server's ``INFO cpu``,
both divided by the adds: steadier than a rate on a shared machine.

Then where one ``Queue.add`` goes (EchoMQ only, medians of per-call times): building
its script call without I/O (validation, id, JSON, arguments), the same EVALSHA sent
through redis-py, the server's time inside the script (``INFO commandstats``), and a PING
through redis-py: the machine's floor for any one-round-trip enqueue.

Peers run ``bench/peers/driver.py --workload enqueue`` under ``bench/.peers-venv``
(``bench/peers/run.py`` makes it), which reports the same figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import benchlib as bl
import redis

import echomq
from echomq import aio

HERE = Path(__file__).resolve().parent
PEERS_VENV = HERE / ".peers-venv"
QUEUE = "benchq"


def server_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def figures(lat: list[float], elapsed: float, cpu: float, srv: float) -> dict[str, float]:
    n = len(lat)
    return {"rate": n / elapsed, "p50_ms": bl.pct(lat, 50) * 1000,
            "p99_ms": bl.pct(lat, 99) * 1000, "client_cpu_us": cpu / n * 1e6,
            "server_cpu_us": srv / n * 1e6}


def run_sync(url: str, r: redis.Redis, jobs: int) -> dict[str, float]:
    q = echomq.Queue(QUEUE, redis_url=url)
    q.add("noop")  # connect, load the script, register the queue
    lat = []
    clock = time.perf_counter
    s0, c0, t0 = server_cpu_s(r), time.process_time(), clock()
    for _ in range(jobs):
        t = clock()
        q.add("noop")
        lat.append(clock() - t)
    elapsed, cpu, srv = clock() - t0, time.process_time() - c0, server_cpu_s(r) - s0
    q.close()
    return figures(lat, elapsed, cpu, srv)


def run_aio(url: str, r: redis.Redis, jobs: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        q = aio.Queue(QUEUE, redis_url=url)
        await q.add("noop")
        lat = []
        clock = time.perf_counter
        s0, c0, t0 = server_cpu_s(r), time.process_time(), clock()
        for _ in range(jobs):
            t = clock()
            await q.add("noop")
            lat.append(clock() - t)
        elapsed, cpu, srv = clock() - t0, time.process_time() - c0, server_cpu_s(r) - s0
        await q.close()
        return figures(lat, elapsed, cpu, srv)
    return asyncio.run(main())


def run_peer(url: str, system: str, jobs: int) -> dict[str, Any]:
    py = PEERS_VENV / "arq" / "bin" / "python" if system == "arq" else \
        PEERS_VENV / "bin" / "python"
    out = subprocess.run([str(py), str(HERE / "peers" / "driver.py"), "--system", system,
                          "--workload", "enqueue", "--redis-url", url, "--jobs", str(jobs),
                          "--bulk-jobs", "0"],
                         capture_output=True, text=True, timeout=600, cwd=str(HERE / "peers"))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["(no output)"])[-1]}
    res = json.loads(lines[-1])
    return {"rate": res["one_rate"], "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"],
            "client_cpu_us": res["client_cpu_us"], "server_cpu_us": res["server_cpu_us"]}


def breakdown(url: str, r: redis.Redis, jobs: int) -> dict[str, float]:
    """Medians, µs: the call built without I/O, EVALSHA through redis-py, the server's
    time per EVALSHA, a PING through redis-py."""
    q = echomq.Queue(QUEUE, redis_url=url)
    q.add("noop")
    planner = q.planner
    clock = time.perf_counter

    def build() -> Any:
        spec = planner.spec("noop", None, None, None, None, None, None, None)
        return planner.calls([spec])[0]

    built = []
    for _ in range(jobs):
        t = clock()
        build()
        built.append(clock() - t)
    script, keys, _ = build()
    sent = []
    r.config_resetstat()
    for _ in range(jobs):
        _, _, args = build()
        t = clock()
        script(q.redis, keys, args)
        sent.append(clock() - t)
    calls = bl.commandstats(r).get("evalsha", 0)
    usec = r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0)
    ping = []
    for _ in range(jobs):
        t = clock()
        q.redis.ping()
        ping.append(clock() - t)
    q.close()
    return {"build_us": statistics.median(built) * 1e6,
            "evalsha_us": statistics.median(sent) * 1e6,
            "server_script_us": usec / max(calls, 1),
            "ping_us": statistics.median(ping) * 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--peers", default="", help="comma-separated: huey, rq, arq, saq, ...")
    ap.add_argument("--json", metavar="FILE|-")
    a = ap.parse_args(argv)
    systems = ["echomq", "echomq-aio", *[p for p in a.peers.split(",") if p]]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    with bl.private_redis() as server:
        r = bl.client(server.url)
        for _ in range(a.runs):
            for s in systems:
                r.flushall()
                if s == "echomq":
                    res: dict[str, Any] = run_sync(server.url, r, a.jobs)
                elif s == "echomq-aio":
                    res = run_aio(server.url, r, a.jobs)
                else:
                    res = run_peer(server.url, s, a.jobs)
                results[s].append(res)
        r.flushall()
        where = breakdown(server.url, r, a.jobs)
    rows = []
    for s in systems:
        ok = [x for x in results[s] if "error" not in x]
        if not ok:
            rows.append([s, results[s][-1].get("error", "?")[:60], "", "", "", ""])
            continue
        def m(k: str, spec: str = ",.0f", ok: list[dict[str, Any]] = ok) -> str:
            vals = [x[k] for x in ok]
            return (f"{statistics.median(vals):{spec}} "
                    f"({min(vals):{spec}}–{max(vals):{spec}})")
        rows.append([s, m("rate"), m("p50_ms", ".3f"), m("p99_ms", ".3f"),
                     m("client_cpu_us"), m("server_cpu_us", ".1f")])
    bl.print_table(f"One-by-one adds, {a.jobs:,} per run, median (min–max) of {a.runs}",
                   ["system", "adds/s", "p50 ms", "p99 ms", "client CPU µs/add",
                    "server CPU µs/add"], rows)
    bl.print_table("Where one Queue.add goes (medians, µs)", ["part", "µs"],
                   [["the call built, no I/O", f"{where['build_us']:.1f}"],
                    ["EVALSHA admit.lua through redis-py", f"{where['evalsha_us']:.1f}"],
                    ["  of it, the server inside the script", f"{where['server_script_us']:.1f}"],
                    ["PING through redis-py (the floor)", f"{where['ping_us']:.1f}"]])
    if a.json:
        bl.emit_json(a.json, {"jobs": a.jobs, "runs": a.runs, "results": results,
                              "breakdown": where})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
