"""Idle cost: Redis commands per second while consumers wait on an empty queue.

    .venv/bin/python bench/idle.py                    # supervisor ×1,4,8 and a standalone Consumer
    .venv/bin/python bench/idle.py --seconds 60 --json -

After start-up and a warm-up job, ``CONFIG RESETSTAT``; idle ``--seconds``; then
``INFO commandstats``. The figure is the summed ``calls`` of every command
(commands run inside Lua scripts included, the way the server counts them) per
second, less the benchmark's own CONFIG/INFO. Beat: ``--beat-ms`` (1000).
Note the lease period (30 s by default) paces the supervisor's reap, so windows
shorter than that under-count it; the default window is 30 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import benchlib as bl

import echomq

OWN = ("config|resetstat", "config", "info")


def one_run(mode: str, processes: int, seconds: float, beat_ms: int,
            doorbell: str = "list") -> dict[str, Any]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("idle")
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
            time.sleep(2.0 + beat_ms / 1000)
            r.config_resetstat()
            t0 = time.perf_counter()
            time.sleep(seconds)
            stats = bl.commandstats(r)
            elapsed = time.perf_counter() - t0
            if not proc.alive():
                raise RuntimeError(f"consumer died while idle:\n{proc.tail()}")
        finally:
            proc.stop()
        q.close()
    calls = {k: v for k, v in stats.items() if k not in OWN}
    total = sum(calls.values())
    return {"per_s": total / elapsed, "seconds": elapsed,
            "by_command": {k: round(v / elapsed, 3) for k, v in sorted(calls.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--beat-ms", type=int, default=1000)
    ap.add_argument("--processes", default="1,4,8")
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
        runs = [one_run(mode, procs, args.seconds, args.beat_ms, kind) for _ in range(args.runs)]
        results.append({"mode": mode, "processes": procs, "doorbell": kind,
                        "beat_ms": args.beat_ms,
                        "per_s": bl.summary([x["per_s"] for x in runs]),
                        "by_command": runs[len(runs) // 2]["by_command"]})
        print(f"  {mode} ×{procs} {kind}: {bl.fmt_range(results[-1]['per_s'], '{:.2f}')} cmd/s",
              file=sys.stderr)
    bl.print_table(
        f"EchoMQ idle cost: Redis commands/s (INFO commandstats, scripts' inner calls "
        f"included), beat {args.beat_ms} ms, {args.seconds:g} s window, "
        f"median (min–max) of {args.runs} run(s)",
        ["consumer", "procs", "doorbell", "commands/s", "by command (/s)"],
        [[x["mode"], x["processes"], x["doorbell"], bl.fmt_range(x["per_s"], "{:.2f}"),
          " ".join(f"{k}={v:g}" for k, v in x["by_command"].items())] for x in results])
    bl.emit_json(args.json, {"bench": "idle", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
