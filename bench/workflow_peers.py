"""A chord of N no-op members and a callback: EchoMQ, Celery's chord and BullMQ's flow on
one private server, runs interleaved, each system with 2 worker processes.

    .venv/bin/python bench/workflow_peers.py [--members 10000] [--runs 3] [--crash both]

Per run and system: the server is flushed, the workers start and are ready, then the
clock runs from the send of the workflow to its callback's result. ``--crash`` (``off``,
``on`` or ``both``): one member ends its worker process on its first run, and the figure
that matters is whether the callback ran, and how many times. EchoMQ: the supervisor,
``--processes 2``, tasks from bench/chord_tasks.py, ``echomq.chord(group, callback)``.
Celery: bench/peers/chord_celery.py (``-c 2`` prefork, in ``bench/.peers-venv`` with
``celery[redis]``; ``--acks-late`` too, the documented setting for redelivery of a task
whose process died). BullMQ: bench/peers/flow_bullmq.mjs (2 workers, ``stalledInterval``
1 s; ``npm install`` in bench/node).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib as bl

import echomq

QUEUE = bl.unique_queue("chord")
os.environ["BENCH_CHORD_QUEUE"] = QUEUE
import chord_tasks  # noqa: E402 - its queue name is read at import

BENCH = Path(__file__).parent
CELERY_PY = BENCH / ".peers-venv" / "bin" / "python"
NODE_PATH = BENCH / "node" / "node_modules"


def run_echomq(url: str, members: int, crash: bool, timeout: float) -> dict[str, Any]:
    queue = QUEUE
    env = {"BENCH_CHORD_QUEUE": queue, "PYTHONPATH": str(BENCH)}
    os.environ["ECHOMQ_REDIS_URL"] = url  # where the tasks send
    r = bl.client(url)
    r.flushall()
    argv = bl.supervisor_argv(url, queue, "handlers:noop", 2)
    argv = [a for a in argv if a not in ("--handler", "handlers:noop")] + ["--tasks",
                                                                           "chord_tasks"]
    sup = bl.Proc(argv, env={"BENCH_REDIS_URL": url, **env}, tag="supervisor")
    try:
        q = echomq.Queue(queue, redis_url=url)
        probe = chord_tasks.noop.send(-1)  # the workers are up: their boot is not measured
        q.result(probe, timeout=60)
        crash_at = members // 2 if crash else -1
        t0 = time.perf_counter()
        wf = echomq.chord(echomq.group(chord_tasks.noop.s(i, i == crash_at)
                                       for i in range(members)),
                          chord_tasks.total.s()).send()
        try:
            value: Any = wf.result(timeout)
            took: float | None = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            value, took = repr(exc)[:120], None
        late = time.monotonic() + 2.0  # a late second run of the callback would show here
        while time.monotonic() < late:
            time.sleep(0.1)  # a fixed window to watch, nothing to wait on
        return {"system": "echomq", "members": members, "crash": crash, "seconds": took,
                "value": value, "callback_runs": int(r.get("chord:callback-runs") or 0),
                "crash_runs": int(r.get("chord:crash-runs") or 0)}
    finally:
        sup.stop()


def run_peer(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    out = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=timeout + 120, cwd=BENCH)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": (out.stderr or out.stdout)[-300:]}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--crash", choices=("off", "on", "both"), default="both")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--systems", default="echomq,celery,celery-acks-late,bullmq")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    systems = args.systems.split(",")
    crashes = {"off": [False], "on": [True], "both": [False, True]}[args.crash]
    results: dict[str, list[dict[str, Any]]] = {}
    with bl.private_redis() as server:
        url = server.url
        for _ in range(args.runs):
            for crash in crashes:
                for system in systems:
                    tail = ["--members", str(args.members), "--timeout", str(args.timeout),
                            "--url", url] + (["--crash"] if crash else [])
                    if system == "echomq":
                        res = run_echomq(url, args.members, crash, args.timeout)
                    elif system.startswith("celery"):
                        extra = ["--acks-late"] if system == "celery-acks-late" else []
                        res = run_peer([str(CELERY_PY), "peers/chord_celery.py", *tail, *extra],
                                       {}, args.timeout)
                    else:
                        res = run_peer(["node", "peers/flow_bullmq.mjs", *tail],
                                       {"NODE_PATH": str(NODE_PATH)}, args.timeout)
                    results.setdefault(f"{system}{' crash' if crash else ''}", []).append(res)
                    print(json.dumps({"system": system, "crash": crash, **res}), flush=True)
    rows = []
    for key, runs in results.items():
        secs = [r["seconds"] for r in runs if r.get("seconds") is not None]
        cell = bl.fmt_range(bl.summary(secs), "{:.2f}") if secs else "never"
        rows.append([key, f"{len(secs)}/{len(runs)}", cell,
                     " ".join(str(r.get("callback_runs", "?")) for r in runs)])
    bl.print_table(f"chord of {args.members:,} no-op members, 2 worker processes each",
                   ["system", "callback done", "seconds median (min–max)", "callback runs"],
                   rows)
    bl.emit_json(args.json, results)


if __name__ == "__main__":
    sys.exit(main())
