"""What the server spends per job inside the claim and settle scripts, and per call.

    .venv/bin/python bench/script_costs.py                 # 64,000 jobs, batches 1,16,64,256
    .venv/bin/python bench/script_costs.py --batches 16 --json -

On a private server: ``--jobs`` no-op jobs on one lane are claimed in batches (as a
supervised consumer claims them, with a claims record) and then settled, and
``INFO commandstats`` gives the server's time per job in ``EVALSHA`` and in the commands
the scripts call. Then single commands are timed inside one script (10,000 calls, so the
script's own start is spread thin) on a hash shaped like a leased job's.
"""

from __future__ import annotations

import argparse
from typing import Any

import benchlib as bl
import redis

import echomq
from echomq.keys import Keys
from echomq.lanes import Lanes, Outcome

JOB = {"id": "3f2a9c1e-aaaa-bbbb-cccc-123456789012", "name": "noop", "payload": "{}",
       "lane": "default", "state": "active", "attempts": 1, "max_attempts": 3, "stalls": 0,
       "max_stalls": 1, "backoff": "", "created_ms": 1764560000000,
       "token": "1764560000000123", "started_ms": 1764560000000}
CALLS = {
    "HGET, one field": "redis.call('HGET', 'h', 'name')",
    "HSET, four fields": "redis.call('HSET', 'h', 'state', 'active', 'attempts', 1, "
                         "'token', '1764560000000001', 'started_ms', 1764560000000)",
    "HMGET, claim's nine fields (three absent)":
        "redis.call('HMGET', 'h', 'name', 'payload', 'attempts', 'max_attempts', 'backoff', "
        "'created_ms', 'timeout_ms', 'trace', 'alone')",
    "HMGET, the six present": "redis.call('HMGET', 'h', 'name', 'payload', 'attempts', "
                              "'max_attempts', 'backoff', 'created_ms')",
    "string.format('%d')": "local s = string.format('%d', 1764560000000000 + i)",
    "key concatenation": "local s = 'emq:{q}:job:' .. i",
}
LOOPS = 10_000


def _usec(r: redis.Redis) -> tuple[float, float]:
    """(EVALSHA µs, µs of the commands scripts called) since the last reset."""
    stats = r.info("commandstats")
    inner = sum(v["usec"] for k, v in stats.items()
                if k not in ("cmdstat_evalsha", "cmdstat_config|resetstat", "cmdstat_info"))
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0)), float(inner)


def per_job(jobs: int, batch: int) -> dict[str, Any]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("script-costs")
        q = echomq.Queue(name, redis_url=server.url)
        bl.admit_noop(q, jobs, 1)
        lanes = Lanes(redis.Redis.from_url(server.url), Keys(name), q.settings)
        lanes.claimer = "bench"
        r.config_resetstat()
        batches, done = [], 0
        while done < jobs:
            got = lanes.claim(batch)
            batches.append(got)
            done += len(got)
        claim = _usec(r)
        r.config_resetstat()
        for got in batches:
            lanes.settle([Outcome(c.id, c.token, "c") for c in got])
        settle = _usec(r)
        q.close()
    return {"batch": batch, "claim_us": claim[0] / jobs, "claim_inner_us": claim[1] / jobs,
            "settle_us": settle[0] / jobs, "settle_inner_us": settle[1] / jobs}


def per_call() -> dict[str, float]:
    out = {}
    with bl.private_redis() as server:
        r = bl.client(server.url)
        r.hset("h", mapping=JOB)  # type: ignore[arg-type]
        for label, body in CALLS.items():
            sha = r.script_load(f"for i = 1, {LOOPS} do {body} end return 1")
            r.config_resetstat()
            for _ in range(20):
                r.evalsha(sha, 0)
            out[label] = _usec(r)[0] / (20 * LOOPS)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=64_000)
    ap.add_argument("--batches", default="1,16,64,256", help="claim sizes, comma-separated")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    rows = [per_job(args.jobs, int(b)) for b in args.batches.split(",")]
    calls = per_call()
    bl.print_table(f"Server time per job in the scripts, {args.jobs:,} jobs (µs)",
                   ["batch", "claim", "its commands", "settle", "its commands"],
                   [[x["batch"], f"{x['claim_us']:.1f}", f"{x['claim_inner_us']:.1f}",
                     f"{x['settle_us']:.1f}", f"{x['settle_inner_us']:.1f}"] for x in rows])
    bl.print_table("One call inside a script (µs)", ["call", "µs"],
                   [[label, f"{us:.2f}"] for label, us in calls.items()])
    bl.emit_json(args.json, {"bench": "script_costs", "per_job": rows, "per_call": calls})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
