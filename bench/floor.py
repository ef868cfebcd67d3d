"""The durable floor: admit rate per durability dial, memory of spilled jobs, rehydrate time.

    .venv/bin/python bench/floor.py                       # SQLite and the local PostgreSQL
    .venv/bin/python bench/floor.py --backends sqlite --jobs 100000

For each backend (a SQLite file; a throwaway PostgreSQL database):
1. delayed-job admit rate under volatile / folded / sync, one by one (2,000 adds) and in
   bulk (``add_many``, 20,000), plus how fast the scheduler folds the folded log;
2. Valkey ``used_memory`` for ``--jobs`` jobs due in a day, before and after spilling;
3. time to rehydrate them after the server restarts empty.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid

import redis
import sqlalchemy as sa
from benchlib import private_redis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _floor(backend: str) -> tuple[Floor, str, sa.Engine | None]:
    if backend == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp(prefix='emq-floor-')}/floor.db"
        admin = None
    else:
        admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        name = f"echomq_bench_{uuid.uuid4().hex[:10]}"
        with admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = admin.url.set(database=name).render_as_string(hide_password=False)
    floor = Floor.from_url(url)
    floor.upgrade()
    return floor, url, admin


def _drop(url: str, admin: sa.Engine | None) -> None:
    if admin is not None:
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{sa.make_url(url).database}" WITH (FORCE)')


def _tick_until_folded(s: Scheduler, client: redis.Redis) -> float:
    t = time.perf_counter()
    while client.llen(s.keys.fold):
        s.next_restore = float("inf")
        s.tick(0.0)
    return time.perf_counter() - t


def admit_rates(backend: str, floor: Floor, client: redis.Redis) -> None:
    print(f"\n{backend}: delayed-job admit rate per dial (jobs/s)")
    print(f"{'dial':10} {'one by one':>12} {'bulk':>12} {'fold jobs/s':>12}")
    for dial in ("volatile", "folded", "sync"):
        name = f"admit-{dial}-{uuid.uuid4().hex[:6]}"
        q = echomq.Queue(name, redis=client, floor=floor,
                         durability="sync" if dial == "sync" else None)
        if dial != "volatile":
            client.hset(q.keys.meta, "fold", "1")
        t = time.perf_counter()
        for i in range(2000):
            q.add("x", {"i": i}, delay=3600)
        one = 2000 / (time.perf_counter() - t)
        t = time.perf_counter()
        for start in range(0, 20_000, 1000):
            q.add_many([("x", {"i": i}, {"delay": 3600}) for i in range(start, start + 1000)])
        bulk = 20_000 / (time.perf_counter() - t)
        fold = ""
        if dial != "volatile":
            s = Scheduler(name, client, floor, beat_ms=1000, horizon_s=7200)
            n = client.llen(q.keys.fold)
            fold = f"{n / _tick_until_folded(s, client):,.0f}"
        print(f"{dial:10} {one:>12,.0f} {bulk:>12,.0f} {fold:>12}")


def spill_and_rehydrate(backend: str, floor: Floor, server: object, jobs: int) -> None:
    client = redis.Redis.from_url(server.url)  # type: ignore[attr-defined]
    name = f"spill-{uuid.uuid4().hex[:6]}"
    q = echomq.Queue(name, redis=client)
    s = Scheduler(name, client, floor, beat_ms=1000, horizon_s=3600)
    s.tick(0.0)
    base = client.info("memory")["used_memory"]
    t = time.perf_counter()
    for start in range(0, jobs, 1000):
        q.add_many([("x", {"i": i}, {"delay": 86_400})
                    for i in range(start, min(jobs, start + 1000))])
    admit = jobs / (time.perf_counter() - t)
    full = client.info("memory")["used_memory"] - base
    t = time.perf_counter()
    while q.stats()["spilled"] < jobs:
        s.tick(0.0)
    spill_s = time.perf_counter() - t
    spilled = client.info("memory")["used_memory"] - base
    print(f"\n{backend}: {jobs:,} jobs due in a day (admitted at {admit:,.0f}/s)")
    print(f"  Valkey memory in the schedule set: {full / 2**20:,.1f} MiB "
          f"({full / jobs:,.0f} B/job)")
    print(f"  after spilling to the floor:        {spilled / 2**20:,.1f} MiB "
          f"(spilled in {spill_s:.1f}s, {jobs / spill_s:,.0f} jobs/s)")
    # rehydration: un-spill them on the floor first, so they all come back into Valkey
    unspilled = 0
    after = None
    while True:
        rows = floor.open_rows(name, after, 1000)
        if not rows:
            break
        from echomq.floor import FloorRow

        floor.upsert(name, [FloorRow(r.job_id, r.due_ms, r.fields) for r in rows], None)
        unspilled += len(rows)
        after = rows[-1].job_id
    server.restart_empty()  # type: ignore[attr-defined]
    client2 = redis.Redis.from_url(server.url)  # type: ignore[attr-defined]
    s2 = Scheduler(name, client2, floor, beat_ms=1000, horizon_s=10 * 86_400)
    t = time.perf_counter()
    ticks = 0
    while True:  # the scheduler works in slices of 0.1 s; count the ticks it needs
        s2.tick(0.0)
        ticks += 1
        epoch = client2.get(f"emq:{{{name}}}:epoch")
        if epoch and not epoch.startswith(b"rehydrating-"):
            break
    took = time.perf_counter() - t
    back = client2.zcard(f"emq:{{{name}}}:schedule")
    print(f"  rehydrate after an empty restart:   {back:,} jobs in {took:.1f}s "
          f"({back / took:,.0f} jobs/s, {ticks} ticks of at most ~0.1 s each)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--jobs", type=int, default=100_000)
    args = ap.parse_args()
    for backend in args.backends.split(","):
        floor, url, admin = _floor(backend)
        try:
            with private_redis() as server:
                admit_rates(backend, floor, redis.Redis.from_url(server.url))
            with private_redis() as server:
                spill_and_rehydrate(backend, floor, server, args.jobs)
        finally:
            floor.dispose()
            _drop(url, admin)


if __name__ == "__main__":
    main()
