"""Valkey memory per job spilled to the floor: before the spill, and after it.

    .venv/bin/python bench/spill_memory.py                 # 10,000 jobs, payloads of 8 B and 1 KiB
    .venv/bin/python bench/spill_memory.py --jobs 50000 --sizes 100,1000,10000

For each payload size: ``used_memory`` grown by admitting ``--jobs`` jobs due in two
hours (schedule set and job hashes), then after the scheduler (horizon one hour, a
SQLite floor in a temporary directory) spilled them, leaving a stub hash per job (its
small fields, no payload) and its id in the spilled set; and the spilled set's share
alone (the stubs deleted at the end), which is what a spill kept before stubs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import benchlib as bl
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor


def measure(jobs: int, size: int) -> dict[str, Any]:
    with bl.private_redis() as server, tempfile.TemporaryDirectory() as tmp:
        r = bl.client(server.url)
        floor = Floor.from_url(f"sqlite:///{Path(tmp) / 'floor.db'}")
        floor.upgrade()
        name = bl.unique_queue("spillmem")
        q = echomq.Queue(name, redis=r)
        sched = Scheduler(name, r, floor, beat_ms=100, horizon_s=3600)
        sched.tick(0.0)
        before = r.info("memory")["used_memory"]
        payload = {"blob": "x" * max(0, size - 11)}
        for start in range(0, jobs, 5000):
            q.add_many([("far", payload, {"delay": 7200})
                        for _ in range(min(5000, jobs - start))])
        grown = r.info("memory")["used_memory"] - before
        while q.stats()["spilled"] < jobs:
            sched.floor_retry_at = 0.0
            sched.tick(0.0)
        after = r.info("memory")["used_memory"] - before
        # what the spill kept before stubs: the ids in the spilled set alone
        members = [m.decode() for m in r.smembers(q.keys.spilled)]
        for start in range(0, len(members), 5000):
            r.delete(*[q.keys.job(i) for i in members[start:start + 5000]])
        ids_only = r.info("memory")["used_memory"] - before
        sched.close()
        floor.dispose()
        return {"payload_bytes": len(json.dumps(payload, separators=(",", ":"))),
                "jobs": jobs, "in_valkey_b": round(grown / jobs),
                "spilled_b": round(after / jobs), "saved": round(1 - after / grown, 3),
                "ids_only_b": round(ids_only / jobs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--sizes", default="8,1000", help="payload sizes in bytes, comma-separated")
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        row = measure(args.jobs, size)
        print(f"payload {row['payload_bytes']:>6} B: {row['in_valkey_b']:>6} B a job in Valkey, "
              f"{row['spilled_b']:>4} B once spilled ({row['saved']:.0%} given back; "
              f"{row['ids_only_b']} B of it the spilled set, the rest the stubs)")


if __name__ == "__main__":
    main()
