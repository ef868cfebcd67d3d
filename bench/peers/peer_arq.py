"""arq: `arq peer_arq.WorkerSettings` processes (asyncio), JSON job serializer,
`ArqRedis.enqueue_job` (no bulk API), `_defer_by` for delays.

Its best settings (WorkerSettings attributes from arq's Worker documentation): with the
defaults (max_jobs 10, poll_delay 0.5 s) a drain reads at most ten jobs per half second
(the figure is a sleep: 200/s at 2 processes whatever the job); ``poll_delay=0.01``,
``max_jobs=100``, ``keep_result=0`` (no result stored; the payload row keeps its default
hour, as every system keeps results there), ``log_results=False`` and the ``arq`` loggers
at WARNING (it logs two INFO lines per job)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from datetime import timedelta
from typing import Any

import peerlib

NAME = "arq"
PACKAGES = ("arq", "redis")
CONFIG = ("N × `arq peer_arq.WorkerSettings` (poll_delay 0.01 s, max_jobs 100, keep_result 0 "
          "but for the payload row, WARNING logs); JSON job_serializer; `enqueue_job` one by "
          "one (no bulk API; fills use asyncio.gather)")
BULK = False


def _ser(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()


def _deser(b: bytes) -> dict[str, Any]:
    return json.loads(b)


async def noop(ctx: dict[str, Any]) -> None:
    peerlib.count()


async def record(ctx: dict[str, Any], t: float) -> None:
    peerlib.record(t)


async def work(ctx: dict[str, Any], kind: str, data: Any = None) -> Any:
    return await peerlib.awork(kind, data)


def _settings() -> Any:
    from arq.connections import RedisSettings

    return RedisSettings.from_dsn(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))


async def _quiet(ctx: dict[str, Any]) -> None:
    """arq's CLI configures logging at INFO after importing the settings: lower it here."""
    logging.getLogger("arq").setLevel(logging.WARNING)


class WorkerSettings:
    functions = [noop, record, work]
    max_jobs = peerlib.concurrency(100)
    poll_delay = 0.01
    keep_result = 3600 if peerlib.store_results() else 0
    log_results = False
    on_startup = _quiet
    redis_settings = _settings()
    job_serializer = staticmethod(_ser)
    job_deserializer = staticmethod(_deser)


class Producer:
    def __init__(self, url: str) -> None:
        from arq import create_pool
        from arq.connections import RedisSettings

        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(create_pool(
            RedisSettings.from_dsn(url), job_serializer=_ser, job_deserializer=_deser))

    def enqueue(self, kind: str, t: float | None = None) -> None:
        if kind == "noop":
            self.loop.run_until_complete(self.pool.enqueue_job("noop"))
        else:
            self.loop.run_until_complete(self.pool.enqueue_job("record", t))

    def enqueue_delayed(self, t: float, delay: float) -> None:
        self.loop.run_until_complete(
            self.pool.enqueue_job("record", t, _defer_by=timedelta(seconds=delay)))

    def _gather(self, coros: list[Any]) -> None:
        async def run() -> None:
            await asyncio.gather(*coros)
        self.loop.run_until_complete(run())

    def fill(self, n: int) -> None:
        for i in range(0, n, 500):
            self._gather([self.pool.enqueue_job("noop") for _ in range(min(500, n - i))])

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        for i in range(0, n, 500):
            self._gather([self.pool.enqueue_job("work", kind, data)
                          for _ in range(min(500, n - i))])

    def fill_delayed(self, delays: list[float]) -> None:
        for i in range(0, len(delays), 500):
            self._gather([self.pool.enqueue_job("noop", _defer_by=timedelta(seconds=d))
                          for d in delays[i:i + 500]])

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "arq")
    return [[exe, "peer_arq.WorkerSettings"] for _ in range(processes)]
