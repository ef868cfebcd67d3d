"""PostgreSQL queues side by side with EchoMQ's outbox and durable dial (bench/durable.py).

Runs in a virtualenv of its own (``bench/.pgpeers-venv``, on Python 3.12 or newer, which
Oban for Python requires: ``pip install pgqueuer procrastinate oban asyncpg
"psycopg[binary]"``), which bench/durable.py starts with
``--peers``; prints one JSON object, per peer, each part on a fresh database of the local
PostgreSQL:

- ``one_per_tx``, ``hundred_per_tx``: enqueue inside a transaction (jobs/s), one job per
  transaction and 100 per transaction;
- ``c2s_p50``, ``c2s_p99``: commit to handler start (ms), one job at a time on an idle
  worker process: from the moment the enqueue's commit returned to the handler's first
  line (the worker prints its ``time.time()``; both woken by their LISTEN/NOTIFY);
- ``drain``: jobs/s of ``--jobs`` no-op jobs queued first, then run by two worker
  processes (clock from the first completion to the last; the parent counts the
  unfinished rows every 5 ms).

- pgqueuer: ``Queries.enqueue`` on an asyncpg connection inside ``conn.transaction()``
  (its documented driver); 100 per transaction as one list-form enqueue.
  Workers: ``QueueManager.run(batch_size=100)`` (drain: ``mode=drain``).
- procrastinate: ``defer_async`` / ``batch_defer_async`` on its psycopg connector. It has
  no enqueue on the caller's transaction outside Django: each call is its own commit.
  Workers: ``run_worker_async`` with ``listen_notify`` and an async task (drain:
  ``concurrency=10, wait=False``).
- Oban for Python (``oban``): ``Oban.enqueue`` / ``enqueue_many`` with ``conn=`` (a psycopg
  AsyncConnection in a transaction: its documented transactional insert); its
  ``pg_notify('oban_insert')`` wakes the worker. Workers: ``Oban(pool=..., queues=
  {"default": limit})`` with an async worker, limit 10 (its default) for the latency,
  100 for the drain.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

import psycopg

WORKER = sys.argv[1:2] == ["--worker"]  # a worker process: --worker PEER MODE URL
ARGS = [] if WORKER else sys.argv[1:]
ADMIN = ARGS[0] if ARGS else "postgresql://postgres@127.0.0.1:5432/test"
JOBS = int(ARGS[1]) if len(ARGS) > 1 else 20_000
SINGLE = 500
BATCHES = 20
LATENCY_JOBS = 300  # after 20 that warm up
PROCESSES = 2


async def _database(tag: str) -> str:
    name = f"echomq_peer_{tag}_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(ADMIN, autocommit=True) as c:
        await c.execute(f'CREATE DATABASE "{name}"')
    return ADMIN.rsplit("/", 1)[0] + "/" + name


async def _drop(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    async with await psycopg.AsyncConnection.connect(ADMIN, autocommit=True) as c:
        await c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def pgqueuer() -> dict[str, float]:
    import asyncpg
    from pgqueuer.queries import Queries

    url = await _database("pgq")
    try:
        conn = await asyncpg.connect(url)
        q = Queries.from_asyncpg_connection(conn)
        await q.install()
        t = time.perf_counter()
        for i in range(SINGLE):
            async with conn.transaction():
                await q.enqueue("job", json.dumps({"i": i}).encode())
        one = SINGLE / (time.perf_counter() - t)
        t = time.perf_counter()
        for b in range(BATCHES):
            async with conn.transaction():
                await q.enqueue(["job"] * 100,
                                [json.dumps({"i": b * 100 + i}).encode() for i in range(100)],
                                [0] * 100)
        hundred = BATCHES * 100 / (time.perf_counter() - t)
        await conn.close()
        return {"one_per_tx": one, "hundred_per_tx": hundred}
    finally:
        await _drop(url)


async def procrastinate() -> dict[str, float]:
    import procrastinate as pc

    url = await _database("pc")
    try:
        app = pc.App(connector=pc.PsycopgConnector(conninfo=url))
        task = app.task(name="job")(lambda **kw: None)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            t = time.perf_counter()
            for i in range(SINGLE):
                await task.defer_async(i=i)
            one = SINGLE / (time.perf_counter() - t)
            t = time.perf_counter()
            for b in range(BATCHES):
                await task.batch_defer_async(*({"i": b * 100 + i} for i in range(100)))
            hundred = BATCHES * 100 / (time.perf_counter() - t)
        return {"one_per_tx": one, "hundred_per_tx": hundred}
    finally:
        await _drop(url)


class _Oban:
    """Oban for Python's no-op worker, made the same way in the parent and in a worker
    process (Oban resolves a job's worker by its registered name)."""

    cls: Any = None

    @classmethod
    def worker(cls, mode: str = "drain") -> Any:
        if cls.cls is None:
            from oban import worker

            class ObanJob:
                async def process(self, job: Any) -> None:
                    if mode == "latency":
                        _print_start(job.args["i"])

            # the same name in every process, however this file was started
            ObanJob.__module__, ObanJob.__qualname__ = "peers_pg", "ObanJob"
            cls.cls = worker(queue="default")(ObanJob)
        return cls.cls


async def _oban_schema(url: str) -> None:
    from oban.schema import install_sql

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(install_sql())


async def oban() -> dict[str, float]:
    from oban import Oban

    url = await _database("oban")
    try:
        await _oban_schema(url)
        pool = await Oban.create_pool(url, min_size=1, max_size=2)
        client = Oban(pool=pool)  # client mode: it enqueues, runs nothing
        job = _Oban.worker()
        async with await psycopg.AsyncConnection.connect(url) as conn:
            t = time.perf_counter()
            for i in range(SINGLE):
                async with conn.transaction():
                    await client.enqueue(job.new({"i": i}), conn=conn)
            one = SINGLE / (time.perf_counter() - t)
            t = time.perf_counter()
            for b in range(BATCHES):
                async with conn.transaction():
                    await client.enqueue_many([job.new({"i": b * 100 + i})
                                               for i in range(100)], conn=conn)
            hundred = BATCHES * 100 / (time.perf_counter() - t)
        await pool.close()
        return {"one_per_tx": one, "hundred_per_tx": hundred}
    finally:
        await _drop(url)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _worker(peer: str, mode: str, url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--worker", peer, mode, url,
        stdout=asyncio.subprocess.PIPE)


async def _latency(peer: str, url: str, enqueue: Any) -> dict[str, float]:
    """Commit to start: ``enqueue(i)`` returns once the job's commit did."""
    worker = await _worker(peer, "latency", url)
    assert worker.stdout is not None
    lat = []
    try:
        for i in range(-20, LATENCY_JOBS):
            await enqueue(i)
            committed = time.time()
            line = await asyncio.wait_for(worker.stdout.readline(), 60)
            job_i, started = line.decode().split()
            assert int(job_i) == i, (job_i, i)
            if i >= 0:
                lat.append((float(started) - committed) * 1000)
    finally:
        worker.terminate()
        await worker.wait()
    return {"c2s_p50": _pct(lat, 50), "c2s_p99": _pct(lat, 99)}


async def _drain(peer: str, url: str, unfinished_sql: str) -> float:
    """The drain rate of the jobs already queued, by PROCESSES worker processes."""
    workers = [await _worker(peer, "drain", url) for _ in range(PROCESSES)]
    first = None
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            left = (await (await c.execute(unfinished_sql)).fetchone())[0]
            if first is None and left < JOBS:
                first = time.perf_counter()
            if left == 0:
                break
            await asyncio.sleep(0.005)  # the count is the only signal both peers give
        else:
            raise TimeoutError(f"{peer}: {left} jobs left after 600 s")
    done = time.perf_counter()
    for w in workers:
        w.terminate()
        await w.wait()
    assert first is not None
    return JOBS / (done - first)


def _print_start(i: Any) -> None:
    print(f"{i} {time.time():.6f}", flush=True)


async def pgqueuer_worker(mode: str, url: str) -> None:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    qm = QueueManager(Queries.from_asyncpg_connection(await asyncpg.connect(url)))

    @qm.entrypoint("job")
    async def job(j: Any) -> None:
        if mode == "latency":
            _print_start(json.loads(j.payload)["i"])

    await qm.run(batch_size=100, mode=QueueExecutionMode.drain if mode == "drain"
                 else QueueExecutionMode.continuous)


async def procrastinate_worker(mode: str, url: str) -> None:
    import procrastinate as pc

    app = pc.App(connector=pc.PsycopgConnector(conninfo=url))

    @app.task(name="job")
    async def job(i: int = 0) -> None:
        if mode == "latency":
            _print_start(i)

    async with app.open_async():
        await app.run_worker_async(concurrency=1 if mode == "latency" else 10,
                                   wait=mode != "drain", listen_notify=True,
                                   install_signal_handlers=True)


async def oban_worker(mode: str, url: str) -> None:
    from oban import Oban

    _Oban.worker(mode)
    pool = await Oban.create_pool(url, min_size=2, max_size=4)
    # the queue's limit is its concurrency (10 by default): 100 for the drain of no-op
    # async jobs, as for procrastinate's concurrency
    async with Oban(pool=pool, queues={"default": 10 if mode == "latency" else 100}):
        await asyncio.Event().wait()  # until the parent's SIGTERM


async def oban_run() -> dict[str, float]:
    from oban import Oban

    out: dict[str, float] = await oban()
    url = await _database("oban")
    try:
        await _oban_schema(url)
        pool = await Oban.create_pool(url, min_size=1, max_size=2)
        client = Oban(pool=pool)
        job = _Oban.worker()
        async with await psycopg.AsyncConnection.connect(url) as conn:

            async def enqueue(i: int) -> None:
                async with conn.transaction():
                    await client.enqueue(job.new({"i": i}), conn=conn)

            out.update(await _latency("oban", url, enqueue))
            await conn.execute("DELETE FROM oban_jobs")
            await conn.commit()
            for start in range(0, JOBS, 1000):
                async with conn.transaction():
                    await client.enqueue_many([job.new({"i": 0})
                                               for _ in range(min(1000, JOBS - start))],
                                              conn=conn)
        await pool.close()
        out["drain"] = await _drain("oban", url, "SELECT count(*) FROM oban_jobs WHERE state "
                                    "IN ('available', 'scheduled', 'executing', 'retryable')")
        return out
    finally:
        await _drop(url)


async def pgqueuer_run() -> dict[str, float]:
    import asyncpg
    from pgqueuer.queries import Queries

    out: dict[str, float] = await pgqueuer()
    url = await _database("pgq")
    try:
        conn = await asyncpg.connect(url)
        q = Queries.from_asyncpg_connection(conn)
        await q.install()

        async def enqueue(i: int) -> None:
            async with conn.transaction():
                await q.enqueue("job", json.dumps({"i": i}).encode())

        out.update(await _latency("pgqueuer", url, enqueue))
        await conn.execute("DELETE FROM pgqueuer")
        for start in range(0, JOBS, 1000):
            n = min(1000, JOBS - start)
            await q.enqueue(["job"] * n, [b"{}"] * n, [0] * n)
        await conn.close()
        out["drain"] = await _drain("pgqueuer", url, "SELECT count(*) FROM pgqueuer")
        return out
    finally:
        await _drop(url)


async def procrastinate_run() -> dict[str, float]:
    import procrastinate as pc

    out: dict[str, float] = await procrastinate()
    url = await _database("pc")
    try:
        app = pc.App(connector=pc.PsycopgConnector(conninfo=url))
        task = app.task(name="job")(lambda **kw: None)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

            async def enqueue(i: int) -> None:
                await task.defer_async(i=i)

            out.update(await _latency("procrastinate", url, enqueue))
            for start in range(0, JOBS, 1000):
                await task.batch_defer_async(*({} for _ in range(min(1000, JOBS - start))))
        out["drain"] = await _drain("procrastinate", url,
                                    "SELECT count(*) FROM procrastinate_jobs "
                                    "WHERE status IN ('todo', 'doing')")
        return out
    finally:
        await _drop(url)


async def main() -> None:
    out = {"pgqueuer": await pgqueuer_run(), "procrastinate": await procrastinate_run(),
           "oban": await oban_run()}
    print(json.dumps(out))


if __name__ == "__main__":
    if WORKER:
        peer, mode, url = sys.argv[2:5]
        worker = {"pgqueuer": pgqueuer_worker, "procrastinate": procrastinate_worker,
                  "oban": oban_worker}[peer]
        try:
            asyncio.run(worker(mode, url))
        except KeyboardInterrupt:
            pass
    else:
        asyncio.run(main())
