"""Workflows: a chord of 10,000 no-op members and a chain of 1,000 no-op jobs, against
the same jobs admitted without a workflow, on one private server in one run.

    .venv/bin/python bench/workflows.py                  # 3 runs of each, interleaved
    .venv/bin/python bench/workflows.py --members 10000 --chain 1000 --runs 3 --json -

Each measurement: admit (one round trip per queue for a workflow, add_many in batches
of 20,000 for the plain jobs), then one consumer in this process (``Consumer.run(burst=
True)``, a task handler per job) runs everything until the last job completed. Reported:
the admit time, the total wall time, the client's CPU (this process) and the server's
CPU (INFO used_cpu_user+sys), each per job, and the workflow's overhead per member as
the difference of the per-job totals. A chain runs one job at a time by construction
(each waits for the one before); its plain twin is the same jobs with nothing between
them. The server is flushed between measurements; the callback's result is checked.

Peers, each in its own environment against a server of the same kind:
``bench/peers/chord_celery.py`` (Celery's chord, 2 prefork processes) and
``bench/peers/flow_bullmq.mjs`` (BullMQ's flow, 2 worker processes), both with a
``--crash`` mode where one member kills its worker process on its first run. EchoMQ's
answer to that crash is tests/supervisor/test_workflow_faults.py.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from typing import Any

import benchlib as bl

import echomq
from echomq.task import tasks_on

QUEUE = bl.unique_queue("wf")


@echomq.task(queue=QUEUE, name="bench.wf.noop")
def noop(*_: Any) -> int:
    return 1


@echomq.task(queue=QUEUE, name="bench.wf.total")
def total(values: list[int]) -> int:
    return sum(values)


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _server_cpu(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(url: str, kind: str, n: int) -> dict[str, float]:
    """One measurement of ``kind`` (chord, chord-plain, chain, chain-plain) at size n."""
    r = bl.client(url)
    r.flushall()
    q = echomq.Queue(QUEUE, redis_url=url)
    t0, c0, s0 = time.perf_counter(), _cpu(), _server_cpu(r)
    last: str
    if kind == "chord":
        wf = echomq.chord(echomq.group(noop.s() for _ in range(n)), total.s()).send()
        last = wf.job_ids[-1]
    elif kind == "chain":
        wf = echomq.chain(*(noop.s() for _ in range(n))).send()
        last = wf.job_ids[-1]
    else:
        jobs = n + 1 if kind == "chord-plain" else n
        ids: list[str] = []
        for start in range(0, jobs, 20_000):
            ids += q.add_many([(noop.name, {"args": [], "kwargs": {}})]
                              * min(20_000, jobs - start))
        last = ids[-1]
    admitted = time.perf_counter() - t0
    ran = echomq.Consumer(q, tasks_on(QUEUE), beat_ms=200).run(burst=True)
    wall = time.perf_counter() - t0
    jobs = ran
    assert q.get(last).state == "completed", q.get(last)
    if kind == "chord":
        assert q.result(last) == n
    out = {"jobs": jobs, "admit_s": admitted, "wall_s": wall,
           "client_cpu_us_per_job": (_cpu() - c0) / jobs * 1e6,
           "server_cpu_us_per_job": (_server_cpu(r) - s0) / jobs * 1e6,
           "wall_us_per_job": wall / jobs * 1e6}
    q.close()
    r.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--chain", type=int, default=1_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = {"chord": args.members, "chord-plain": args.members,
             "chain": args.chain, "chain-plain": args.chain}
    results: dict[str, list[dict[str, float]]] = {k: [] for k in sizes}
    with bl.private_redis() as server:
        echomq.configure(redis_url=server.url)
        for _ in range(args.runs):  # interleaved: drift falls on every kind alike
            for kind, n in sizes.items():
                results[kind].append(measure(server.url, kind, n))
    rows = []
    data: dict[str, Any] = {"pid": os.getpid(), "runs": args.runs, "kinds": {}}
    for kind, runs in results.items():
        s = {m: bl.summary([r[m] for r in runs]) for m in runs[0] if m != "jobs"}
        data["kinds"][kind] = {"jobs": runs[0]["jobs"], **s}
        rows.append([kind, int(runs[0]["jobs"]), bl.fmt_range(s["admit_s"], "{:.3f}"),
                     bl.fmt_range(s["wall_s"], "{:.2f}"),
                     bl.fmt_range(s["wall_us_per_job"]),
                     bl.fmt_range(s["client_cpu_us_per_job"]),
                     bl.fmt_range(s["server_cpu_us_per_job"])])
    bl.print_table("workflows vs the same jobs without one (median, min-max)",
                   ["kind", "jobs", "admit s", "total s", "wall us/job", "client CPU us/job",
                    "server CPU us/job"], rows)
    for wf, plain in (("chord", "chord-plain"), ("chain", "chain-plain")):
        k = data["kinds"]
        extra = {m: k[wf][m]["median"] - k[plain][m]["median"]
                 for m in ("wall_us_per_job", "client_cpu_us_per_job", "server_cpu_us_per_job")}
        data[f"{wf}_overhead_us_per_member"] = extra
        print(f"{wf}: overhead per member (median difference): wall "
              f"{extra['wall_us_per_job']:,.0f} us, client CPU "
              f"{extra['client_cpu_us_per_job']:,.0f} us, server CPU "
              f"{extra['server_cpu_us_per_job']:,.0f} us")
    bl.emit_json(args.json, data)


if __name__ == "__main__":
    main()
