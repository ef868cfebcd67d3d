"""What flow control costs: no-op drain with it unused, with lane limits, with priorities;
and the server memory a limited lane takes.

    .venv/bin/python bench/flow_control.py                      # 20,000 jobs, 100 lanes, 4 procs
    .venv/bin/python bench/flow_control.py --runs 3 --json -    # median (min–max) of 3 runs
    .venv/bin/python bench/flow_control.py --scripts-only       # the scripts alone, one client
    .venv/bin/python bench/flow_control.py --baseline-python OTHER/.venv/bin/python \\
        --baseline-tree OTHER                                   # plus another checkout's

Drain modes (each run: a fresh private server, the jobs bulk-admitted, then
``echomq-supervisor start --processes N`` with handler ``handlers:noop``; jobs/s from
the first completed job until the completed total reaches N, as bench/drain.py):

- ``unused``: no limits, no priorities (the plain claim path).
- ``limits``: every lane with its own ``max_active`` (high enough never to bind, so the
  figure is the bookkeeping: the active count, the per-lane lookup, the put-back).
- ``limits-1``: every lane with ``max_active=1`` (binding: strict order in every lane).
- ``priorities``: the jobs spread over priorities 0, 4 and 9.
- ``baseline``: this script's ``unused`` drain run by another checkout's interpreter
  (``--baseline-python``, from ``--baseline-tree``), so with that checkout's scripts and
  supervisor: the code before flow control.

Each mode reports jobs/s (wall clock: on a busy machine it swings with the other
processes) and the server's CPU time per job (``INFO cpu`` over the drain: the cost of
the scripts, which is what flow control changes, and steady under load).

Modes alternate within each run, so drift on a shared machine hits them alike.
``--scripts-only`` replaces the supervisor by one in-process client that claims 16 jobs
and settles them (settle and the next claim in one round trip) until the queue is empty:
the scripts' cost without consumer processes competing for the cores.

Memory: on a fresh server, ``--mem-lanes`` lanes of one waiting job each; ``used_memory``
is read after recording a limit on every lane (the limits hash), after claiming one job
of each lane at ``max_active=1`` (the active count; the lane then blocked, a member of the
blocked set), and after 10 claimed starts per lane under ``rate=10`` (the starts log).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import benchlib as bl
import redis

import echomq
from echomq.lanes import Lanes, Outcome

MODES = ("unused", "limits", "limits-1", "priorities")


def prepare(q: echomq.Queue, mode: str, jobs: int, lanes: int) -> None:
    """Admit the jobs (and set the limits) of one mode."""
    if mode in ("limits", "limits-1"):
        for i in range(lanes):
            q.set_lane_limit(f"l{i}", max_active=1_000_000 if mode == "limits" else 1)
    if mode == "priorities":
        done = 0
        while done < jobs:
            n = min(20_000, jobs - done)
            q.add_many([("noop", None, {"lane": f"l{(done + i) % lanes}",
                                        "priority": (0, 4, 9)[(done + i) % 3]})
                        for i in range(n)])
            done += n
    else:
        bl.admit_noop(q, jobs, lanes)


def server_cpu(r: redis.Redis) -> float:
    """The server process's CPU seconds so far (user + system): unlike wall time, it does
    not grow when other processes take the machine's cores."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def scripts_run(mode: str, jobs: int, lanes: int) -> dict[str, float]:
    """The scripts alone: one client claims 16 and settles them, until the queue is empty.
    No consumer processes compete for the cores, so the server's CPU per job is steadier."""
    with bl.private_redis() as server:
        r = bl.client(server.url)
        q = echomq.Queue(bl.unique_queue("flow"), redis_url=server.url)
        prepare(q, mode, jobs, lanes)
        claimer = Lanes(q.redis, q.keys, q.settings)
        r.config_resetstat()
        cpu0 = server_cpu(r)
        t0 = time.perf_counter()
        done = 0
        batch = claimer.claim(16)
        while batch:
            done += len(batch)
            _, batch = claimer.settle_and_claim(
                [Outcome(c.id, c.token, "c") for c in batch], 16)
        elapsed = time.perf_counter() - t0
        cpu = server_cpu(r) - cpu0
        if done != jobs:
            raise RuntimeError(f"{mode}: claimed {done} of {jobs}")
        # commands the scripts ran (INFO commandstats counts them): exact, unlike times
        inner = sum(n for name, n in bl.commandstats(r).items()
                    if name not in ("evalsha", "info", "config|resetstat"))
        return {"rate": jobs / elapsed, "server_cpu_us": cpu / jobs * 1e6,
                "commands": inner / jobs}


def one_run(mode: str, processes: int, jobs: int, lanes: int, timeout: float
            ) -> dict[str, float]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("flow")
        q = echomq.Queue(name, redis_url=server.url)
        prepare(q, mode, jobs, lanes)
        cpu0 = server_cpu(r)
        launched = time.perf_counter()
        proc = bl.start_supervisor(server.url, name, "handlers:noop", processes)
        try:
            res = bl.measure_drain(lambda: bl.completed(r, name), jobs, timeout,
                                   launched=launched)
        finally:
            proc.stop()
        cpu = server_cpu(r) - cpu0
        counts = q.counts()
        if counts["completed"] != jobs or counts["waiting"] or counts["active"]:
            raise RuntimeError(f"{mode}: unexpected counts after drain: {counts}")
        q.close()
        return {"rate": float(res["rate"]), "server_cpu_us": cpu / jobs * 1e6}


def baseline_run(python: str, tree: str, processes: int, jobs: int, lanes: int,
                 scripts_only: bool) -> dict[str, float]:
    """One "unused" drain by this script under another checkout's interpreter (so with
    that checkout's echomq: its scripts, its supervisor)."""
    out = subprocess.run(
        [python, str(Path(__file__).resolve()), "--modes", "unused", "--jobs", str(jobs),
         "--lanes", str(lanes), "--processes", str(processes), "--mem-lanes", "0",
         "--json", "-", *(["--scripts-only"] if scripts_only else [])],
        cwd=tree, check=True, capture_output=True, text=True)
    data = json.loads(out.stdout[out.stdout.index("{"):])
    return dict(data["raw"]["unused"][0])


def memory(lanes: int) -> dict[str, float]:
    """Server bytes per lane for each piece of flow-control state."""
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("flowmem")
        q = echomq.Queue(name, redis_url=server.url, claim_batch=lanes)
        q.add_many([("noop", None, {"lane": f"lane-{i:06d}"}) for i in range(lanes)])
        q.add_many([("noop", None, {"lane": f"lane-{i:06d}"}) for i in range(lanes)])

        def used() -> int:
            return int(r.info("memory")["used_memory"])

        before = used()
        for i in range(lanes):
            q.set_lane_limit(f"lane-{i:06d}", max_active=1)
        limits = used()
        claimer = Lanes(q.redis, q.keys, q.settings)
        got = 0
        while got < lanes:
            got += len(claimer.claim(min(1000, lanes - got)))
        while r.llen(q.keys.ring):  # meets every lane again at its limit: each leaves it
            claimer.claim(1000)
        blocked = used()
        # the claimed jobs' own growth (state, token, lease) is the same without limits:
        # measured on a queue without them and taken off
        plain = echomq.Queue(bl.unique_queue("flowmem"), redis_url=server.url)
        plain.add_many([("noop", None, {"lane": f"lane-{i:06d}"}) for i in range(lanes)])
        plain.add_many([("noop", None, {"lane": f"lane-{i:06d}"}) for i in range(lanes)])
        p0 = used()
        pc = Lanes(plain.redis, plain.keys, plain.settings)
        got = 0
        while got < lanes:
            got += len(pc.claim(min(1000, lanes - got)))
        p1 = used()
        out = {"limit recorded": (limits - before) / lanes,
               "max_active in use (count, lane blocked)":
                   ((blocked - limits) - (p1 - p0)) / lanes}
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("flowmem")
        q = echomq.Queue(name, redis_url=server.url)
        for i in range(lanes):
            q.set_lane_limit(f"lane-{i:06d}", rate=10, per_s=60)
        q.add_many([("noop", None, {"lane": f"lane-{i % lanes:06d}"})
                    for i in range(lanes * 10)])
        before = int(r.info("memory")["used_memory"])
        claimer = Lanes(q.redis, q.keys, q.settings)
        got = 0
        while got < lanes * 10:
            got += len(claimer.claim(1000))
        after = int(r.info("memory")["used_memory"])
        # the claimed jobs' own growth (state, token, lease) is the same without limits:
        # measured on a queue without them and taken off
        plain = echomq.Queue(bl.unique_queue("flowmem"), redis_url=server.url)
        plain.add_many([("noop", None, {"lane": f"lane-{i % lanes:06d}"})
                        for i in range(lanes * 10)])
        p0 = int(r.info("memory")["used_memory"])
        pc = Lanes(plain.redis, plain.keys, plain.settings)
        got = 0
        while got < lanes * 10:
            got += len(pc.claim(1000))
        p1 = int(r.info("memory")["used_memory"])
        out["rate=10 in use (10 starts logged)"] = ((after - before) - (p1 - p0)) / lanes
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--lanes", type=int, default=100)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--baseline-python", help="interpreter of the checkout to compare with")
    ap.add_argument("--baseline-tree", help="that checkout's root")
    ap.add_argument("--mem-lanes", type=int, default=10_000)
    ap.add_argument("--scripts-only", action="store_true",
                    help="one in-process client claims and settles instead of a supervisor")
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    timeout = args.timeout or max(120.0, args.jobs / 200)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}: use {', '.join(MODES)}")
    raw: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    if args.baseline_python:
        raw = {"baseline": [], **raw}
    for run in range(args.runs):
        for mode in raw:
            if mode == "baseline":
                res = baseline_run(args.baseline_python, args.baseline_tree or ".",
                                   args.processes, args.jobs, args.lanes, args.scripts_only)
            elif args.scripts_only:
                res = scripts_run(mode, args.jobs, args.lanes)
            else:
                res = one_run(mode, args.processes, args.jobs, args.lanes, timeout)
            raw[mode].append(res)
            print(f"  run {run + 1} {mode}: {res['rate']:,.0f} jobs/s, server "
                  f"{res['server_cpu_us']:.1f} us CPU/job", file=sys.stderr)
    ref = "baseline" if "baseline" in raw else "unused"
    rows = []
    if raw:
        ref_rate = bl.summary([x["rate"] for x in raw[ref]])["median"] if ref in raw else 0
        ref_cpu = (bl.summary([x["server_cpu_us"] for x in raw[ref]])["median"]
                   if ref in raw else 0)
        for mode, values in raw.items():
            rate = bl.summary([x["rate"] for x in values])
            cpu = bl.summary([x["server_cpu_us"] for x in values])
            rows.append([mode, bl.fmt_range(rate),
                         f"{(rate['median'] / ref_rate - 1) * 100:+.1f}%" if ref_rate else "",
                         bl.fmt_range(cpu, "{:.1f}"),
                         f"{(cpu['median'] / ref_cpu - 1) * 100:+.1f}%" if ref_cpu else ""])
            if args.scripts_only:
                rows[-1].append(f"{values[0]['commands']:.2f}")
        how = ("one client claiming 16 and settling them (scripts only)" if args.scripts_only
               else f"supervisor ×{args.processes}")
        bl.print_table(
            f"Flow control: {args.jobs:,} no-op jobs over {args.lanes} lanes, {how}, "
            f"median (min–max) of {args.runs} run(s)",
            ["mode", "jobs/s", f"vs {ref}", "server CPU us/job", f"vs {ref}",
             *(["commands/job"] if args.scripts_only else [])], rows)
    mem = memory(args.mem_lanes) if args.mem_lanes else {}
    if mem:
        bl.print_table(f"Server memory per lane ({args.mem_lanes:,} lanes)",
                       ["state", "bytes per lane"], [[k, f"{v:,.0f}"] for k, v in mem.items()])
    bl.emit_json(args.json, {"bench": "flow_control", "jobs": args.jobs, "lanes": args.lanes,
                             "processes": args.processes,
                             "raw": raw,
                             "memory_bytes_per_lane": mem})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
