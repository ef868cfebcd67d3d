"""Benchmark regression check, robust to a noisy machine: EchoMQ's no-op drain as a ratio to a
raw redis-py reference loop measured in the same run on the same private server.

    .venv/bin/python bench/regression.py            # check against bench/baseline.json
    .venv/bin/python bench/regression.py --update   # measure and write a new baseline

Each round, in one process on one private server: the reference (pipelines of 100 `RPUSH`
+ 100 `LPOP` of 1-byte values), then EchoMQ (20,000 no-op jobs admitted with `add_many`,
drained by an in-process `Consumer(...).run(burst=True)` claiming batches as the
supervisor's consumers do; a standalone sync consumer claims one job at a time, measured
apart by standalone_claims.py). Both are counted per CPU second
(this process's CPU time plus the server's, from `INFO cpu`), not per wall second: on a
loaded machine wall time mostly measures the other tenants, CPU time the work done. The
ratio of the two rates cancels most of what a slower machine does to both. Seven rounds,
interleaved; the median ratio is compared with the baseline and the check fails (exit 1)
when it dropped by more than the tolerance (20%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import benchlib as bl
from standalone_claims import Batched

import echomq

BASELINE = Path(__file__).with_name("baseline.json")
TOLERANCE = 0.20
JOBS = 20_000
REF_OPS = 200_000


def cpu_seconds(r: Any) -> float:
    """CPU time used so far by this process and by the server."""
    info = r.info("cpu")
    return time.process_time() + float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def reference_rate(r: Any) -> float:
    """Operations per CPU second of a raw redis-py pipeline loop: the yardstick of the run."""
    key = bl.unique_queue("ref")
    batch = 100
    t0 = cpu_seconds(r)
    for _ in range(REF_OPS // (2 * batch)):
        pipe = r.pipeline(transaction=False)
        for _ in range(batch):
            pipe.rpush(key, b"x")
        for _ in range(batch):
            pipe.lpop(key)
        pipe.execute()
    return REF_OPS / (cpu_seconds(r) - t0)


def drain_rate(url: str, r: Any) -> float:
    """Jobs per CPU second of an in-process standalone consumer draining JOBS no-op jobs."""
    name = bl.unique_queue("regress")
    q = echomq.Queue(name, redis_url=url)
    bl.admit_noop(q, JOBS)
    consumer = Batched(q, lambda job: None)
    t0 = cpu_seconds(r)
    consumer.run(burst=True)
    elapsed = cpu_seconds(r) - t0
    done = q.counts()["completed"]
    q.close()
    if done != JOBS:
        raise SystemExit(f"the drain completed {done} of {JOBS} jobs")
    return JOBS / elapsed


def measure(rounds: int) -> dict[str, Any]:
    """Interleaved rounds of reference and drain; the median ratio and every round's figures."""
    refs, drains, ratios = [], [], []
    with bl.private_redis() as server:
        r = bl.client(server.url)
        drain_rate(server.url, r)  # warm-up: scripts loaded, imports and allocator settled
        for _ in range(rounds):
            ref = reference_rate(r)
            drain = drain_rate(server.url, r)
            refs.append(ref)
            drains.append(drain)
            ratios.append(drain / ref)
            r.flushall()
    return {"ratio": statistics.median(ratios), "ratios": ratios, "reference_ops_s": refs,
            "drain_jobs_s": drains}


def main(argv: list[str] | None = None) -> int:
    """Measure, then compare with (or with ``--update`` write) the baseline; 1 on a regression."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--update", action="store_true", help="write bench/baseline.json")
    args = parser.parse_args(argv)
    got = measure(args.rounds)
    print(f"reference {statistics.median(got['reference_ops_s']):,.0f} ops/CPU-s, drain "
          f"{statistics.median(got['drain_jobs_s']):,.0f} jobs/CPU-s, ratio {got['ratio']:.4f} "
          f"(rounds: {', '.join(f'{x:.4f}' for x in got['ratios'])})")
    if args.update:
        BASELINE.write_text(json.dumps({"ratio": round(got["ratio"], 4), "jobs": JOBS,
                                        "reference_ops": REF_OPS}, indent=2) + "\n")
        print(f"baseline written: {BASELINE}")
        return 0
    base = json.loads(BASELINE.read_text())["ratio"]
    floor = base * (1 - TOLERANCE)
    verdict = "ok" if got["ratio"] >= floor else "REGRESSION"
    print(f"baseline ratio {base:.4f}; fails below {floor:.4f}: {verdict}")
    return 0 if got["ratio"] >= floor else 1


if __name__ == "__main__":
    sys.exit(main())
