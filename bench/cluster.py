"""EchoMQ on a Valkey Cluster: no-op drain of many queues, cluster vs one node; failover time.

    .venv/bin/python bench/cluster.py                      # 30 queues x 200 jobs, then failover
    .venv/bin/python bench/cluster.py --per-queue 1000 --no-failover --json -

Drain: the same jobs (``echomq.add_many`` over every queue) on a private 3-master,
3-replica cluster and on one private server, each drained by one supervisor serving
every queue with one process each (handler ``handlers:noop``). The clock starts at
the first completed job and stops when every queue's completed total is reached.

Failover: one queue on a cluster, a supervisor serving it and a producer admitting a
job every 10 ms. Its master is SIGKILLed; reported are the seconds from the kill to the
cluster agreeing on the new master, and to the first settled job admitted after the
kill (so run by the new master), plus what ``durability="sync"`` (WAIT 1) costs an add.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import benchlib as bl
from echomq.supervisor.drills.localcluster import LocalCluster
from echomq.supervisor.drills.localredis import LocalRedis

import echomq
from echomq.connection import Client, connect, is_cluster, slot_of


def spread(client: Client, count: int, tag: str) -> list[str]:
    """Queue names whose slots fall on every master in turn (any names on one node)."""
    names = [f"{tag}-{i}" for i in range(count)]
    if not is_cluster(client):
        return names
    masters = sorted(n.name for n in client.get_primaries())  # type: ignore[union-attr]
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"{tag}-{i}"
        i += 1
        if client.get_node_from_key(f"emq:{{{name}}}:wake").name == masters[  # type: ignore[union-attr]
                len(out) % len(masters)]:
            out.append(name)
    return sorted(out, key=lambda n: slot_of(f"{{{n}}}"))


def supervisor(url: str, names: list[str], extra: list[str]) -> bl.Proc:
    config = Path(tempfile.mkdtemp(prefix="echomq-bench-cluster-")) / "queues.json"
    config.write_text(json.dumps({"queues": [
        {"name": n, "handler": "handlers:noop", "processes": 1} for n in names]}))
    base = bl.supervisor_argv(url, names[0], "handlers:noop", 1)
    base = base[:base.index("start")]
    argv = [*base, "start", "--redis-url", url, "--config", str(config),
            "--log-level", "WARNING", *extra]
    return bl.Proc(argv, env={"BENCH_REDIS_URL": url}, tag="supervisor")


def drain(mode: str, queues: int, per_queue: int, timeout: float) -> dict[str, Any]:
    server: Any = LocalCluster() if mode == "cluster" else LocalRedis()
    server.start()
    try:
        client = connect(server.url)
        names = spread(client, queues, bl.unique_queue("cl"))
        started = time.perf_counter()
        echomq.add_many({n: [("noop", None)] * per_queue for n in names}, redis=client)
        admit_rate = queues * per_queue / (time.perf_counter() - started)
        stats = [f"emq:{{{n}}}:stats" for n in names]

        def done() -> int:
            return sum(int(client.hget(k, "completed") or 0) for k in stats)

        launched = time.perf_counter()
        proc = supervisor(server.url, names, [])
        try:
            res = bl.measure_drain(done, queues * per_queue, timeout, proc=proc,
                                   interval=0.02, launched=launched)
        finally:
            proc.stop()
        res["admit_rate"] = admit_rate
        return res
    finally:
        server.stop()


def failover(samples: int = 200) -> dict[str, Any]:
    cluster = LocalCluster().start()
    try:
        client = connect(cluster.url)
        [name] = spread(client, 1, bl.unique_queue("fo"))
        victim = cluster.master_of(f"emq:{{{name}}}:wake")
        cluster.enter_away_from(f"emq:{{{name}}}:wake")
        client = connect(cluster.url)
        volatile = echomq.Queue(name + "-v", redis=client)
        synced = echomq.Queue(name, redis=client, durability="sync")
        cost = {}
        for label, q in (("volatile", volatile), ("sync", synced)):
            lat = []
            for _ in range(samples):
                t = time.perf_counter()
                q.add("noop", None)
                lat.append((time.perf_counter() - t) * 1000)
            cost[label] = statistics.median(lat)
        proc = supervisor(cluster.url, [name], ["--beat-ms", "200", "--lease-ms", "3000"])
        posted: list[tuple[float, str]] = []
        stop = threading.Event()
        killed_at: list[float] = []

        def produce() -> None:
            q = echomq.Queue(name, redis=connect(cluster.url))
            i = 0
            while not stop.wait(0.01):  # pacing: one admit every 10 ms
                try:
                    job_id = q.add("noop", None, job_id=f"p{i}")
                except (echomq.EchoMQError, OSError):
                    continue  # the cluster is electing a new master
                if killed_at:
                    posted.append((time.perf_counter(), job_id))
                i += 1

        producer = threading.Thread(target=produce, daemon=True)
        try:
            bl.wait_until(lambda: (echomq.Queue(name, redis=client).counts()["completed"]
                                   >= samples), 60, what="jobs flowing", proc=proc)
            producer.start()
            time.sleep(0.5)  # the producer admits before the kill, too
            killed_at.append(time.perf_counter())
            victim.kill()
            cluster.wait_ok(60)
            healed = time.perf_counter() - killed_at[0]
            probe = echomq.Queue(name, redis=connect(cluster.url))

            def first_settled() -> bool:
                return any((job := probe.get(j)) is not None and job.state == "completed"
                           for _, j in list(posted)[:50])

            bl.wait_until(first_settled, 60, 0.005, "a job settled on the new master", proc)
            settled = time.perf_counter() - killed_at[0]
        finally:
            stop.set()
            if producer.is_alive():
                producer.join(5)
            proc.stop()
        return {"healed_s": healed, "first_settled_s": settled,
                "add_ms_volatile": cost["volatile"], "add_ms_sync": cost["sync"]}
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--queues", type=int, default=30)
    ap.add_argument("--per-queue", type=int, default=200)
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {"bench": "cluster", "queues": args.queues,
                               "per_queue": args.per_queue, "drain": {}}
    for mode in ("one-node", "cluster"):
        res = drain(mode, args.queues, args.per_queue, args.timeout)
        results["drain"][mode] = res
        print(f"  {mode}: {res['rate']:,.0f} jobs/s", file=sys.stderr)
    rows = [[mode, f"{r['rate']:,.0f}", f"{r['drain_s']:.2f}", f"{r['boot_s']:.2f}",
             f"{r['admit_rate']:,.0f}"] for mode, r in results["drain"].items()]
    bl.print_table(f"No-op drain: {args.queues} queues x {args.per_queue:,} jobs, one "
                   "supervisor, one process per queue",
                   ["server", "jobs/s", "drain s", "boot s", "admit jobs/s (add_many)"], rows)
    if not args.no_failover:
        fo = failover()
        results["failover"] = fo
        bl.print_table("Failover: SIGKILL the queue's master (cluster-node-timeout 1000 ms)",
                       ["kill -> cluster ok s", "kill -> first settle on new master s",
                        "add ms (volatile)", "add ms (sync, WAIT 1)"],
                       [[f"{fo['healed_s']:.2f}", f"{fo['first_settled_s']:.2f}",
                         f"{fo['add_ms_volatile']:.3f}", f"{fo['add_ms_sync']:.3f}"]])
    bl.emit_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
