"""Workflows: how long one script call holds the server at the largest shapes allowed.

    .venv/bin/python bench/workflow_scripts.py [--jobs 1001] [--runs 3]

Each shape is admitted on a private server, then the one call that does the most work
is timed through the server's own SLOWLOG (microseconds spent inside the script, not
the round trip): the longest block.lua call of the admit, the settle that releases
``jobs - 1`` dependents of one root (a group after one job), and the settle of a
chain's first job dying, which ends every job below it dead in the same call. The
default is the largest each limit admits (``echomq.depend.MAX_DEPENDENTS`` dependents of
one job, a chain ``MAX_DEPTH`` blocked jobs deep).
"""

from __future__ import annotations

import argparse
from typing import Any

import benchlib as bl

import echomq
from echomq import depend
from echomq.lanes import Lanes, Outcome


def _slowest(r: Any) -> float:
    """The longest command of the SLOWLOG since the last reset, in ms."""
    entries = r.slowlog_get(1000)
    r.slowlog_reset()
    return max((e["duration"] for e in entries), default=0) / 1000


def _settle_first(q: echomq.Queue, outcome: str) -> None:
    lanes = Lanes(q.redis, q.keys, q.settings)
    [job] = lanes.claim(1)
    lanes.settle([Outcome(job.id, job.token, outcome, "1")])


def run(url: str, jobs: int) -> dict[str, float]:
    r = bl.client(url)
    r.config_set("slowlog-log-slower-than", 0)
    out: dict[str, float] = {}
    # a group of jobs-1 after one root (the widest fan-out a workflow allows)
    r.flushall()
    q = echomq.Queue(bl.unique_queue("wfs"), redis_url=url)
    root = q.add("root", job_id="root")
    specs = [q.planner.spec("m", None, None, None, None, f"m{i}", 1, None)
             for i in range(jobs - 1)]
    r.slowlog_reset()
    q.add_blocked(specs, [([root], "fail")] * len(specs))
    out["fan-out admit, longest call"] = _slowest(r)
    _settle_first(q, "c")
    out[f"settle releasing {jobs - 1:,} dependents"] = _slowest(r)
    # a chain of jobs: the first dies, the rest end dead in the same call
    r.flushall()
    q = echomq.Queue(bl.unique_queue("wfs"), redis_url=url)
    first = q.add("root", job_id="c0", max_attempts=1)
    specs = [q.planner.spec("m", None, None, None, None, f"c{i}", 1, None)
             for i in range(1, jobs)]
    q.add_blocked(specs, [([f"c{i - 1}"], "fail") for i in range(1, jobs)])
    assert first == "c0"
    r.slowlog_reset()
    _settle_first(q, "d")
    out[f"death ending a chain of {jobs - 1:,} below it"] = _slowest(r)
    # a chord: 10,000 members, the callback waits for all of them
    r.flushall()
    q = echomq.Queue(bl.unique_queue("wfs"), redis_url=url)
    members = [q.planner.spec("m", None, None, None, None, f"g{i}", 1, None)
               for i in range(10_000)]
    cb = q.planner.spec("cb", None, None, None, None, "cb", 1, None)
    r.slowlog_reset()
    q.add_blocked([*members, cb], [([], "fail")] * 10_000 + [([f"g{i}" for i in range(10_000)],
                                                               "fail")])
    out["chord of 10,000 admit, longest call"] = _slowest(r)
    q.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=depend.MAX_DEPENDENTS + 1)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {}
    with bl.private_redis() as server:
        for _ in range(args.runs):
            for name, ms in run(server.url, args.jobs).items():
                runs.setdefault(name, []).append(ms)
    bl.print_table("one script call, ms inside the server (min-max of runs)",
                   ["call", "ms"], [[k, bl.fmt_range(bl.summary(v), "{:,.1f}")]
                                    for k, v in runs.items()])


if __name__ == "__main__":
    main()
