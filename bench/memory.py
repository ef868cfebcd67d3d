"""Memory: the supervisor's RSS idle and after 20k jobs; Valkey memory for 1M delayed jobs.

    .venv/bin/python bench/memory.py                          # supervisor ×4, 20k jobs, 1M delayed
    .venv/bin/python bench/memory.py --delayed 200000 --json -
    .venv/bin/python bench/memory.py --processes "" --delayed 1000000 --waiting 1000000

Supervisor: ``echomq-supervisor start --processes N`` on an empty queue, RSS
(and USS, the memory unique to each process: forked children share pages with
the parent, so summed RSS over-counts) of the parent and the children, idle,
then again after ``--jobs`` no-op jobs were drained.

Server: ``used_memory`` before and after bulk-admitting ``--delayed`` jobs with
delays spread over an hour (``Queue.add_many``, 20,000 per call), with the
admit rate. No floor is configured, so every job lives in Valkey. ``--waiting`` does
the same for jobs due now (nobody consuming). Each is broken down: ``MEMORY USAGE`` of one
job's hash (its key and value, with ``OBJECT ENCODING``), and the rest per job (the lane
list or the schedule, the allocator's rounding).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import benchlib as bl
import psutil

import echomq

MB = 1024 * 1024


def tree_memory(pid: int) -> dict[str, float]:
    parent = psutil.Process(pid)
    kids = parent.children(recursive=True)

    def mem(p: psutil.Process) -> tuple[float, float]:
        info = p.memory_full_info()
        return info.rss / MB, info.uss / MB

    prss, puss = mem(parent)
    ks = [mem(k) for k in kids]
    return {"parent_rss_mb": prss, "parent_uss_mb": puss, "children": len(kids),
            "children_rss_mb": sum(k[0] for k in ks), "children_uss_mb": sum(k[1] for k in ks),
            "total_uss_mb": puss + sum(k[1] for k in ks)}


def supervisor_memory(processes: int, jobs: int) -> dict[str, Any]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("mem")
        q = echomq.Queue(name, redis_url=server.url)
        proc = bl.start_supervisor(server.url, name, "handlers:noop", processes)
        try:
            q.add("warmup")
            bl.wait_until(lambda: bl.completed(r, name) >= 1, 30, 0.02, "warm-up", proc)
            time.sleep(2.0)
            idle = tree_memory(proc.pid)
            bl.admit_noop(q, jobs)
            bl.wait_until(lambda: bl.completed(r, name) >= jobs + 1, 300, 0.05, "drain", proc)
            time.sleep(1.0)
            after = tree_memory(proc.pid)
        finally:
            proc.stop()
        q.close()
    return {"processes": processes, "jobs": jobs, "idle": idle, "after": after}


def delayed_memory(total: int, chunk: int = 20_000, delayed: bool = True) -> dict[str, Any]:
    with bl.private_redis() as server:
        r = bl.client(server.url)
        q = echomq.Queue(bl.unique_queue("memd" if delayed else "memw"), redis_url=server.url)
        q.add("warmup", delay=7200)  # creates the queue's keys and loads the scripts
        base = int(r.info("memory")["used_memory"])
        t0 = time.perf_counter()
        done = 0
        while done < total:
            n = min(chunk, total - done)
            q.add_many([("noop", None, {"delay": 60 + (done + i) % 3600} if delayed else {})
                        for i in range(n)])
            done += n
        elapsed = time.perf_counter() - t0
        mem = r.info("memory")
        used = int(mem["used_memory"])
        counts = q.counts()
        scheduled = counts["scheduled"] if delayed else counts["waiting"]
        sample = next(iter(r.scan_iter(match=f"{q.keys.prefix}job:*", count=100)))
        hash_bytes = int(r.memory_usage(sample, samples=0) or 0)
        encoding = r.object("encoding", sample)
        fields = len(r.hgetall(sample))
        q.close()
    return {"jobs": total, "scheduled": scheduled, "admit_rate": total / elapsed,
            "hash_bytes": hash_bytes, "hash_fields": fields,
            "hash_encoding": encoding.decode() if isinstance(encoding, bytes) else encoding,
            "admit_s": elapsed, "used_memory_mb": used / MB, "delta_mb": (used - base) / MB,
            "bytes_per_job": (used - base) / total,
            "used_memory_rss_mb": int(mem["used_memory_rss"]) / MB}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--processes", default="4")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--delayed", type=int, default=1_000_000, help="0 skips the server part")
    ap.add_argument("--waiting", type=int, default=0, help="jobs due now, nobody consuming")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    sup = [supervisor_memory(int(p), args.jobs) for p in args.processes.split(",") if p]
    rows = []
    for s in sup:
        for phase in ("idle", "after"):
            m = s[phase]
            rows.append([s["processes"], "idle" if phase == "idle" else f"after {s['jobs']:,} jobs",
                         f"{m['parent_rss_mb']:.1f}", f"{m['parent_uss_mb']:.1f}",
                         f"{m['children_rss_mb']:.1f}", f"{m['children_uss_mb']:.1f}",
                         f"{m['total_uss_mb']:.1f}"])
    bl.print_table("EchoMQ supervisor memory (MiB; USS = unique to the process)",
                   ["procs", "when", "parent RSS", "parent USS", "children RSS (sum)",
                    "children USS (sum)", "total USS"], rows)
    out: dict[str, Any] = {"bench": "memory", "supervisor": sup}
    for kind, total in (("delayed", args.delayed), ("waiting", args.waiting)):
        if not total:
            continue
        d = delayed_memory(total, delayed=kind == "delayed")
        out[kind] = d
        bl.print_table(f"Valkey/Redis memory for {d['jobs']:,} {kind} jobs",
                       ["jobs", "admit jobs/s", "used_memory MiB", "Δ MiB", "bytes/job",
                        "of it, one job hash", "used_memory_rss MiB"],
                       [[f"{d['jobs']:,}", f"{d['admit_rate']:,.0f}", f"{d['used_memory_mb']:.1f}",
                         f"{d['delta_mb']:.1f}", f"{d['bytes_per_job']:.0f}",
                         f"{d['hash_bytes']} ({d['hash_fields']} fields, {d['hash_encoding']})",
                         f"{d['used_memory_rss_mb']:.1f}"]])
    bl.emit_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
