"""Server instructions per job of the no-op drain's scripts, counted by callgrind: a count
a shared machine's load does not move (CPU time moves by ±10 % between drains there).

    .venv/bin/python bench/drain_instructions.py              # 4,000 jobs, events on and off

A private redis-server runs under ``valgrind --tool=callgrind`` (valgrind must be on PATH;
the server is stripped, so only totals are read). Per setting: no-op jobs admitted with
``add_many``, then claimed and settled in batches of 16 by ``Lanes.settle_and_claim`` (the
scripts a batched drain runs), the counters zeroed before and dumped after.
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import subprocess
import tempfile
import time

import redis

import echomq
from echomq.lanes import Lanes, Outcome

BATCH = 16


def counted(url: str, pid: int, out: str, jobs: int, events: bool) -> int:
    """Instructions the server ran to drain ``jobs`` no-op jobs."""
    q = echomq.Queue(f"ins{time.time_ns()}", redis_url=url)
    q.set_events(events)
    q.add_many([("noop", None)] * jobs)
    lanes = Lanes(q.redis, q.keys, q.settings)
    batch = lanes.claim(BATCH)  # the scripts are loaded before counting
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    while batch:
        _, batch = lanes.settle_and_claim([Outcome(c.id, c.token, "c") for c in batch], BATCH)
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    q.close()
    newest = max(glob.glob(out + ".*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    with open(newest) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("summary:"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=4000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        out = os.path.join(d, "cg.out")
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "redis-server",
             "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"redis://127.0.0.1:{port}"
            r = redis.Redis.from_url(url)
            for _ in range(600):  # valgrind takes seconds to start the server
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.1)
            counted(url, server.pid, out, 200, True)  # warm-up
            per_job = {ev: counted(url, server.pid, out, args.jobs, ev) / args.jobs
                       for ev in (False, True)}
        finally:
            server.terminate()
            server.wait()
    off, on = per_job[False], per_job[True]
    print(f"server instructions per job, {args.jobs:,} no-op jobs in batches of {BATCH}: "
          f"events off {off:,.0f}, on {on:,.0f} (+{on / off - 1:.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
