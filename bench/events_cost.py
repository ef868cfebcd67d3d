"""The event stream's cost on the no-op drain, split between the server and the client.

    .venv/bin/python bench/events_cost.py                 # 10,000 jobs, 11 rounds

One private server, one process: each round drains ``--jobs`` no-op jobs twice with an
in-process standalone consumer claiming batches, once with the queue's events on and
once off (``q.set_events``), the order swapped every round. Reported: the server's CPU
per job (``INFO cpu``) and this process's, median and min–max, and the median of each
round's on/off ratio (the two drains of a round run back to back, so the ratio cancels
most of the drift of a shared machine's load).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import benchlib as bl
from standalone_claims import Batched

import echomq


def server_cpu(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(url: str, r: Any, events: bool, jobs: int) -> tuple[float, float]:
    """(server CPU µs per job, client CPU µs per job) of one burst drain."""
    q = echomq.Queue(bl.unique_queue("events"), redis_url=url)
    q.set_events(events)
    bl.admit_noop(q, jobs)
    consumer = Batched(q, lambda job: None)
    s0, c0 = server_cpu(r), time.process_time()
    consumer.run(burst=True)
    s, c = server_cpu(r) - s0, time.process_time() - c0
    done = q.counts()["completed"]
    q.close()
    if done != jobs:
        raise SystemExit(f"the drain completed {done} of {jobs} jobs")
    return s / jobs * 1e6, c / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args(argv)
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    server_ratio, total_ratio = [], []
    with bl.private_redis() as server:
        r = bl.client(server.url)
        drain(server.url, r, True, 2_000)  # warm-up: scripts loaded, imports settled
        for i in range(args.rounds):
            order = [True, False] if i % 2 else [False, True]
            round_ = {on: drain(server.url, r, on, args.jobs) for on in order}
            for on, figures in round_.items():
                got[on].append(figures)
            server_ratio.append(round_[True][0] / round_[False][0])
            total_ratio.append(sum(round_[True]) / sum(round_[False]))
            r.flushall()
    rows = []
    for on in (False, True):
        srv = bl.summary([s for s, _ in got[on]])
        cli = bl.summary([c for _, c in got[on]])
        rows.append(["on" if on else "off", bl.fmt_range(srv, "{:.1f}"),
                     bl.fmt_range(cli, "{:.1f}")])
    bl.print_table(f"No-op drain, {args.jobs:,} jobs, events on and off: median (min–max) of "
                   f"{args.rounds} rounds", ["events", "server CPU µs/job",
                                             "client CPU µs/job"], rows)
    print(f"on/off, median of the rounds' ratios: server {statistics.median(server_ratio):.3f}, "
          f"server + client {statistics.median(total_ratio):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
