"""Async admit rate from one event loop: 100 concurrent producers awaiting ``add``,
against arq's and SAQ's enqueue in the same run on the same server.

    .venv/bin/python bench/async_admit.py                   # 20,000 jobs, 100 producers
    .venv/bin/python bench/async_admit.py --runs 3 --peers arq,saq \
        --peer-python arq=/tmp/pv-arq/bin/python,saq=/tmp/pv-saq/bin/python
    .venv/bin/python bench/async_admit.py --jobs 50000 --producers 100,500 --json -

Each producer is a coroutine that awaits ``aq.add(...)`` (``echomq.aio.Queue``)
or ``task.asend(...)`` in a loop until the shared count is reached; all run on
one event loop, against one private server started for the whole benchmark
(flushed between measurements). The rate is jobs admitted per second of wall
time; every job is checked to be queued once. For scale, the same count through
one thread of sync ``Queue.add``.

Peers (``--peers``) run ``bench/peers/admit_peer.py`` under their own virtualenv
(arq pins ``redis<6``, so it cannot share EchoMQ's process): the same producer loop
around arq's ``enqueue_job`` and SAQ's ``enqueue`` (SAQ once at its default
``max_concurrent_ops`` of 20 and once at 100, one per producer; the better is its
figure). Runs are interleaved: run 1 of every system, then run 2, and so on, so
drift in the machine's load falls on all of them alike. Virtualenvs default to
``bench/.peers-venv`` (``bench/peers/run.py`` makes them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib as bl

import echomq


async def _producers(send: Any, jobs: int, producers: int) -> float:
    left = iter(range(jobs))

    async def producer() -> None:
        for n in left:
            await send(n)

    t0 = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    return time.perf_counter() - t0


PEER_SCRIPT = bl.BENCH_DIR / "peers" / "admit_peer.py"
PEER_PYTHON = {"arq": bl.BENCH_DIR / ".peers-venv" / "arq" / "bin" / "python",
               "saq": bl.BENCH_DIR / ".peers-venv" / "bin" / "python"}
EMQ_MODES = ("aio.Queue.add", "task.asend")
SYNC_MODE = "sync Queue.add (1 thread)"


def one_run(url: str, mode: str, jobs: int, producers: int) -> float:
    """One measurement on the (flushed) server at ``url``: jobs admitted per second."""
    r = bl.client(url)
    r.flushall()
    queue = bl.unique_queue("admit")
    if mode == SYNC_MODE:
        q = echomq.Queue(queue, redis_url=url)
        t0 = time.perf_counter()
        for n in range(jobs):
            q.add("job", {"n": n})
        elapsed = time.perf_counter() - t0
        q.close()
    elif mode == "aio.Queue.add":
        async def main() -> float:
            aq = echomq.aio.Queue(queue, redis_url=url)
            try:
                return await _producers(lambda n: aq.add("job", {"n": n}), jobs, producers)
            finally:
                await aq.close()

        elapsed = asyncio.run(main())
    elif mode == "task.asend":
        @echomq.task(queue=queue, name=f"{queue}.job")
        def job(n: int) -> None: ...

        echomq.configure(redis_url=url)
        try:
            elapsed = asyncio.run(_producers(job.asend, jobs, producers))
        finally:
            echomq.configure(redis_url=None)
    else:
        return _peer_run(url, mode, jobs, producers)
    admitted = r.llen(f"emq:{{{queue}}}:lane:default")
    r.close()
    assert admitted == jobs, (mode, admitted, jobs)
    return jobs / elapsed


def _peer_run(url: str, mode: str, jobs: int, producers: int) -> float:
    """A peer's run in its own virtualenv; ``mode`` is "arq", "saq" or "saq ops=N"."""
    system, _, ops = mode.partition(" ops=")
    argv = [str(PEER_PYTHON[system]), str(PEER_SCRIPT), system, url, str(jobs), str(producers)]
    if ops:
        argv += ["--saq-ops", ops]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["jobs_per_s"])


def _peer_modes(peers: list[str], producers: int) -> list[str]:
    modes = []
    for peer in peers:
        if peer == "saq":
            modes += ["saq ops=20"] + ([f"saq ops={producers}"] if producers != 20 else [])
        else:
            modes.append(peer)
    return modes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--producers", default="100", help="concurrent producers, comma-separated")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--peers", default="", help="peers to measure alongside: arq,saq")
    ap.add_argument("--peer-python", default="",
                    help="system=python of its virtualenv, comma-separated")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    for pair in filter(None, args.peer_python.split(",")):
        system, _, python = pair.partition("=")
        PEER_PYTHON[system] = Path(python)
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEER_PYTHON)
    if unknown:
        ap.error(f"unknown peer(s): {', '.join(sorted(unknown))}")
    configs = [(m, int(p)) for p in args.producers.split(",") if p
               for m in (*EMQ_MODES, *_peer_modes(peers, int(p)))]
    configs.append((SYNC_MODE, 1))
    rates: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    with bl.private_redis() as server:
        for run in range(args.runs):  # interleaved: every system once per run
            for mode, producers in configs:
                rate = one_run(server.url, mode, args.jobs, producers)
                rates[(mode, producers)].append(rate)
                print(f"  run {run + 1}: {mode} ×{producers}: {rate:,.0f} jobs/s",
                      file=sys.stderr)
    results = [{"mode": mode, "producers": producers, "jobs": args.jobs,
                "jobs_per_s": bl.summary(rates[(mode, producers)]),
                "runs": rates[(mode, producers)]} for mode, producers in configs]
    aio = {x["producers"]: x["runs"] for x in results if x["mode"] == "aio.Queue.add"}
    first = aio[configs[0][1]]
    rows = []
    for x in results:
        # aio.Queue.add at the same concurrency (or the first) over this, run by run: the
        # two ran back to back, so the ratio holds up better than the rates under other load
        ratios = [a / b for a, b in zip(aio.get(x["producers"], first), x["runs"], strict=True)]
        x["ratio_runs"] = ratios
        rows.append([x["mode"], x["producers"], f"{min(x['runs']):,.0f}–{max(x['runs']):,.0f}",
                     f"{x['jobs_per_s']['median']:,.0f}",
                     f"{min(ratios):.2f}–{max(ratios):.2f}×"])
    bl.print_table(f"Async admit, {args.jobs:,} jobs from one event loop, {args.runs} "
                   "interleaved run(s) on one server",
                   ["producer", "concurrent", "jobs/s min–max", "median",
                    "aio.Queue.add ÷ this, per run"], rows)
    bl.emit_json(args.json, {"bench": "async_admit", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
