"""What a delayed job's server memory is made of, and the least each way of storing one takes.

    .venv/bin/python bench/memory_floor.py                  # 100,000 jobs per row
    .venv/bin/python bench/memory_floor.py --jobs 200000 --json -

One private server; each row starts from an empty database and reads ``used_memory`` before
and after writing ``--jobs`` entries (pipelined, 1,000 per round trip):

- EchoMQ's delayed job as ``Queue.add_many`` admits it (no floor: the job hash and its
  entry in the schedule);
- the same job written by hand without one of its fields at a time (what each field costs,
  the allocator's rounding included);
- the least a job hash beside a schedule entry can take: a hash with one 1-byte field under
  a key of the same length, and the schedule's entry;
- the schedule's entry alone (a 32-character id in a sorted set);
- the whole job serialized into one sorted-set member (no hash: how huey stores a delayed
  task), with the same fields as EchoMQ's hash.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import benchlib as bl
import redis

import echomq

PIPELINE = 1_000
Writer = Callable[[Any, int], None]


def empty(r: redis.Redis) -> None:
    """Start from an empty database: SYNC, as lazyfree may free an ASYNC flush mid-count."""
    r.execute_command("FLUSHALL", "SYNC")


def per_job(r: redis.Redis, jobs: int, write: Writer) -> float:
    """used_memory bytes per entry after ``write(pipe, i)`` for i in range(jobs)."""
    empty(r)
    base = int(r.info("memory")["used_memory"])
    pipe = r.pipeline(transaction=False)
    for i in range(jobs):
        write(pipe, i)
        if i % PIPELINE == PIPELINE - 1:
            pipe.execute()
    pipe.execute()
    return (int(r.info("memory")["used_memory"]) - base) / jobs


def admitted(r: redis.Redis, url: str, jobs: int) -> tuple[float, dict[str, str]]:
    """Bytes per delayed job as EchoMQ admits it, and one job's fields."""
    empty(r)
    q = echomq.Queue("memfloor", redis_url=url)
    q.add("warmup", delay=7200)  # the queue's own keys and the scripts, outside the count
    base = int(r.info("memory")["used_memory"])
    for start in range(0, jobs, 20_000):
        q.add_many([("noop", None, {"delay": 60 + (start + i) % 3600})
                    for i in range(min(20_000, jobs - start))])
    used = int(r.info("memory")["used_memory"])
    sample = next(k for k in r.scan_iter(match=f"{q.keys.prefix}job:*", count=100)
                  if r.hget(k, "name") == b"noop")
    fields = {k.decode(): v.decode() for k, v in r.hgetall(sample).items()}
    q.close()
    return (used - base) / jobs, fields


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    rows: list[tuple[str, float]] = []
    with bl.private_redis() as server:
        r = bl.client(server.url)
        own, template = admitted(r, server.url, args.jobs)
        rows.append(("EchoMQ delayed job (Queue.add_many)", own))
        prefix, schedule = "emq:{memfloor}:job:", "emq:{memfloor}:schedule"
        ids = [uuid.uuid4().hex for _ in range(args.jobs)]
        due = int(time.time() * 1000) + 60_000

        def job(drop: str | None) -> Writer:
            def write(pipe: Any, i: int) -> None:
                fields = {**template, "id": ids[i], "due_ms": str(due + i)}
                if drop:
                    fields.pop(drop)
                pipe.hset(prefix + ids[i], mapping=fields)
                pipe.zadd(schedule, {ids[i]: due + i})
            return write

        by_hand = per_job(r, args.jobs, job(None))
        rows.append(("the same, written by hand", by_hand))
        for name in template:
            less = by_hand - per_job(r, args.jobs, job(name))
            rows.append((f"  less without field {name!r}", less))

        def least_hash(pipe: Any, i: int) -> None:
            pipe.hset(prefix + ids[i], "n", "1")
            pipe.zadd(schedule, {ids[i]: due + i})

        def entry_only(pipe: Any, i: int) -> None:
            pipe.zadd(schedule, {ids[i]: due + i})

        def one_member(pipe: Any, i: int) -> None:
            message = json.dumps({**template, "id": ids[i], "due_ms": due + i},
                                 separators=(",", ":"))
            pipe.zadd(schedule, {message: due + i})

        rows.append(("least: 1-field hash + schedule entry", per_job(r, args.jobs, least_hash)))
        rows.append(("schedule entry alone", per_job(r, args.jobs, entry_only)))
        rows.append(("whole job in one sorted-set member", per_job(r, args.jobs, one_member)))
        info = r.info("server")
        version = info.get("valkey_version") or info["redis_version"]
    bl.print_table(f"Server memory per delayed job, {args.jobs:,} jobs per row ({version})",
                   ["what", "bytes/job"], [[what, f"{b:.0f}"] for what, b in rows])
    bl.emit_json(args.json, {"bench": "memory_floor", "jobs": args.jobs, "server": version,
                             "fields": sorted(template),
                             "rows": [{"what": w, "bytes_per_job": b} for w, b in rows]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
