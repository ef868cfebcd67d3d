"""The durable dial and the transactional outbox: what they cost and how fast they go.

    .venv/bin/python bench/durable.py                        # SQLite and the local PostgreSQL
    .venv/bin/python bench/durable.py --backends postgresql --runs 3 --jobs 20000

For each floor backend (a SQLite file; a throwaway PostgreSQL database), on a private
redis-server, ``--runs`` times (the summary is median and min-max):

1. ``add`` latency (p50/p99, ms) of immediate jobs under "folded" and "durable";
2. ``add_many`` throughput (jobs/s, batches of 1,000) under both;
3. drain of ``--jobs`` no-op jobs by ``echomq-supervisor --processes 2`` under both dials
   (jobs/s, clock from the first completion; CPU seconds of the supervisor tree per
   1,000 jobs, steadier than the rate on a shared machine);
4. ``tx=`` enqueue (jobs/s): one job per transaction, and 100 per transaction, on one
   connection held throughout;
5. (PostgreSQL) commit to handler start (p50/p99, ms) through the supervisor's relay,
   woken by NOTIFY, under both dials: from the moment the job's ``COMMIT`` returned to
   the producer to the handler's first line, one job at a time. (SQLite has no NOTIFY:
   its relay runs each beat.) bench/outbox_hops.py breaks this time down hop by hop.

``--peers`` (PostgreSQL): in each run, right after EchoMQ's, bench/peers_pg.py measures
pgqueuer's and procrastinate's enqueue, commit to start and drain (two worker processes)
the same way on the same PostgreSQL, in the virtualenv ``bench/.pgpeers-venv`` (see that
script); the tables set them side by side and give the ratios of each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import benchlib as bl
import psutil
import sqlalchemy as sa

import echomq
from echomq.floor import Floor

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
ADDS = 1000  # single adds timed per dial
BEAT_MS = 100


def make_floor(backend: str) -> tuple[str, Callable[[], None]]:
    """A migrated floor URL and its cleanup."""
    if backend == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp(prefix='emq-durable-')}/floor.db"
        drop: Callable[[], None] = lambda: None  # noqa: E731
    else:
        admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        name = f"echomq_bench_{uuid.uuid4().hex[:10]}"
        with admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = admin.url.set(database=name).render_as_string(hide_password=False)

        def drop() -> None:
            with admin.connect() as c:
                c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()
    with Floor.from_url(url) as floor:
        floor.upgrade()
    return url, drop


def add_latency(url: str, floor: Floor, dial: str) -> dict[str, float]:
    q = echomq.Queue(bl.unique_queue(f"lat-{dial}"), redis_url=url, floor=floor,
                     durability=dial)
    q.add("warm", {})
    lat = []
    for i in range(ADDS):
        t = time.perf_counter()
        q.add("x", {"i": i})
        lat.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    for start in range(0, 20_000, 1000):
        q.add_many([("x", {"i": i}) for i in range(start, start + 1000)])
    bulk = 20_000 / (time.perf_counter() - t)
    q.close()
    return {"p50": bl.pct(lat, 50), "p99": bl.pct(lat, 99), "bulk": bulk}


def _cpu(proc: bl.Proc) -> float:
    total = 0.0
    for p in [psutil.Process(proc.popen.pid), *bl._descendants(proc.popen.pid)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def drain(url: str, floor_url: str, dial: str, jobs: int) -> dict[str, float]:
    name = bl.unique_queue(f"drain-{dial}")
    proc = bl.start_supervisor(url, name, "handlers:noop", 2, beat_ms=BEAT_MS,
                               extra=["--floor-url", floor_url, "--durability", dial])
    client = bl.client(url)
    try:
        bl.wait_until(lambda: client.hget(f"emq:{{{name}}}:meta", "durability") is not None,
                      30, what="the supervisor's start", proc=proc)
        q = echomq.Queue(name, redis_url=url, floor=floor_url)
        q.pause()  # admit everything first, then measure the drain alone
        for start in range(0, jobs, 1000):
            q.add_many([("x", {}) for _ in range(start, min(jobs, start + 1000))])
        cpu0 = _cpu(proc)
        q.resume()
        res = bl.measure_drain(lambda: bl.completed(client, name), jobs, 300, proc=proc)
        res["cpu_ms_per_1k"] = (_cpu(proc) - cpu0) / jobs * 1e6
        q.floor.dispose()
        q.close()
        return res
    finally:
        proc.stop()


def tx_enqueue(url: str, floor_url: str) -> dict[str, float]:
    """One job per transaction, and 100, on one connection held throughout (as the peers
    in bench/peers_pg.py hold theirs); a plain engine, as an application's."""
    q = echomq.Queue(bl.unique_queue("tx"), redis_url=url)
    engine = sa.create_engine(floor_url)
    n = 1000
    with engine.connect() as conn:
        with conn.begin():
            q.add("warm", {}, tx=conn)
        t = time.perf_counter()
        for i in range(n):
            with conn.begin():
                q.add("x", {"i": i}, tx=conn)
        one = n / (time.perf_counter() - t)
        t = time.perf_counter()
        for b in range(20):
            with conn.begin():
                q.add_many([("x", {"i": i}) for i in range(b * 100, b * 100 + 100)],
                           tx=conn)
        hundred = 2000 / (time.perf_counter() - t)
        with conn.begin():
            conn.exec_driver_sql("DELETE FROM emq_outbox")
    engine.dispose()
    q.close()
    return {"one_per_tx": one, "hundred_per_tx": hundred}


def commit_to_start(url: str, floor_url: str, dial: str, count: int = 300) -> dict[str, float]:
    """Commit to handler start through the supervisor's relay, one job at a time (each
    commit's wake-up is measured on an idle relay): from the moment the job's ``COMMIT``
    returned to the producer to the handler's first line (``handlers:started``)."""
    name = bl.unique_queue(f"c2s-{dial}")
    proc = bl.start_supervisor(url, name, "handlers:started", 1, beat_ms=BEAT_MS,
                               extra=["--floor-url", floor_url, "--durability", dial])
    client = bl.client(url)
    client.delete("bench:start")
    engine = sa.create_engine(floor_url)
    q = echomq.Queue(name, redis_url=url)
    lat = []
    try:
        bl.wait_until(lambda: client.hget(f"emq:{{{name}}}:meta", "durability") is not None,
                      30, what="the supervisor's start", proc=proc)
        for i in range(-20, count):  # the first 20 warm the connections up
            with engine.connect() as conn:
                conn.begin()
                q.add("x", {"i": i}, tx=conn)
                conn.commit()
                committed = time.time()
            reply = client.blpop(["bench:start"], 30)
            if reply is None:
                raise TimeoutError(f"job {i} did not start within 30 s\n{proc.tail()}")
            job_i, started = reply[1].decode().split()
            if int(job_i) != i:
                raise RuntimeError(f"job {job_i} started, {i} expected")
            if i >= 0:
                lat.append((float(started) - committed) * 1000)
        return {"p50": bl.pct(lat, 50), "p99": bl.pct(lat, 99)}
    finally:
        proc.stop()
        engine.dispose()
        q.close()


def peers(jobs: int) -> dict[str, Any]:
    """pgqueuer's and procrastinate's enqueue, commit to start and drain
    (bench/peers_pg.py in its own virtualenv)."""
    python = bl.BENCH_DIR / ".pgpeers-venv" / "bin" / "python"
    done = subprocess.run([str(python), str(bl.BENCH_DIR / "peers_pg.py"),
                           PG_ADMIN.replace("+psycopg", ""), str(jobs)],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"peers_pg.py failed: {done.stderr[-500:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def one_run(backend: str, jobs: int, with_peers: bool = False) -> dict[str, Any]:
    floor_url, drop = make_floor(backend)
    floor = Floor.from_url(floor_url)
    try:
        with bl.private_redis() as server:
            out: dict[str, Any] = {}
            for dial in ("folded", "durable"):
                out[f"add_{dial}"] = add_latency(server.url, floor, dial)
                out[f"drain_{dial}"] = drain(server.url, floor_url, dial, jobs)
            out["tx"] = tx_enqueue(server.url, floor_url)
            if backend == "postgresql":  # SQLite: the relay runs each beat, no NOTIFY
                for dial in ("folded", "durable"):
                    out[f"c2s_{dial}"] = commit_to_start(server.url, floor_url, dial)
            if with_peers and backend == "postgresql":
                out["peers"] = peers(jobs)
            return out
    finally:
        floor.dispose()
        drop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--peers", action="store_true",
                    help="pgqueuer and procrastinate side by side (PostgreSQL)")
    ap.add_argument("--json", default=None, help="write the raw results here ('-': stdout)")
    args = ap.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        results[backend] = [one_run(backend, args.jobs, args.peers) for _ in range(args.runs)]
        rs = results[backend]

        def agg(path: Callable[[dict[str, Any]], float], fmt: str = "{:,.1f}",
                rs: list[dict[str, Any]] = rs) -> str:
            vals = [path(r) for r in rs]
            return (f"{fmt.format(statistics.median(vals))} "
                    f"({fmt.format(min(vals))}-{fmt.format(max(vals))})")

        rows = []
        for dial in ("folded", "durable"):
            rows.append([dial, agg(lambda r, d=dial: r[f"add_{d}"]["p50"], "{:.2f}"),
                         agg(lambda r, d=dial: r[f"add_{d}"]["p99"], "{:.2f}"),
                         agg(lambda r, d=dial: r[f"add_{d}"]["bulk"], "{:,.0f}"),
                         agg(lambda r, d=dial: r[f"drain_{d}"]["rate"], "{:,.0f}"),
                         agg(lambda r, d=dial: r[f"drain_{d}"]["cpu_ms_per_1k"], "{:,.0f}")])
        bl.print_table(f"{backend}: immediate jobs, {args.jobs:,} drained by 2 processes "
                       f"(median, min-max of {args.runs})",
                       ["dial", "add p50 ms", "add p99 ms", "add_many jobs/s", "drain jobs/s",
                        "drain CPU ms/1k"], rows)
        bl.print_table(f"{backend}: the outbox (tx=)",
                       ["1 job/tx jobs/s", "100 jobs/tx jobs/s"],
                       [[agg(lambda r: r["tx"]["one_per_tx"], "{:,.0f}"),
                         agg(lambda r: r["tx"]["hundred_per_tx"], "{:,.0f}")]])
        if backend != "postgresql":
            continue
        rows = [[f"echomq {dial}", agg(lambda r: r["tx"]["one_per_tx"], "{:,.0f}"),
                 agg(lambda r: r["tx"]["hundred_per_tx"], "{:,.0f}"),
                 agg(lambda r, d=dial: r[f"c2s_{d}"]["p50"], "{:.2f}"),
                 agg(lambda r, d=dial: r[f"c2s_{d}"]["p99"], "{:.2f}"),
                 agg(lambda r, d=dial: r[f"drain_{d}"]["rate"], "{:,.0f}")]
                for dial in ("folded", "durable")]
        for peer in rs[0].get("peers", {}):
            rows.append([peer] + [
                agg(lambda r, p=peer, k=k: r["peers"][p][k], fmt)
                for k, fmt in (("one_per_tx", "{:,.0f}"), ("hundred_per_tx", "{:,.0f}"),
                               ("c2s_p50", "{:.2f}"), ("c2s_p99", "{:.2f}"),
                               ("drain", "{:,.0f}"))])
        bl.print_table(f"{backend}: side by side (median, min-max of {args.runs}); commit "
                       "to start from the commit's return, one job at a time",
                       ["", "1 job/tx jobs/s", "100 jobs/tx jobs/s", "commit->start p50 ms",
                        "commit->start p99 ms", f"drain {args.jobs:,} jobs/s"], rows)
        for peer in rs[0].get("peers", {}):
            bl.print_table(f"{backend}: echomq / {peer}, the ratio in each run",
                           ["1 job/tx", "100 jobs/tx", "c2s p50 (peer/echomq folded)",
                            "durable drain"],
                           [[agg(lambda r, p=peer: r["tx"]["one_per_tx"]
                                 / r["peers"][p]["one_per_tx"], "{:.2f}x"),
                             agg(lambda r, p=peer: r["tx"]["hundred_per_tx"]
                                 / r["peers"][p]["hundred_per_tx"], "{:.2f}x"),
                             agg(lambda r, p=peer: r["peers"][p]["c2s_p50"]
                                 / r["c2s_folded"]["p50"], "{:.2f}x"),
                             agg(lambda r, p=peer: r["drain_durable"]["rate"]
                                 / r["peers"][p]["drain"], "{:.2f}x")]])
    if args.json:
        bl.emit_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
