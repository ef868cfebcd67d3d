"""taskiq with taskiq-redis: `taskiq worker peer_taskiq:broker --workers N` (asyncio,
RedisStreamBroker (acknowledged), its default max-async-tasks), `task.kiq()` (no bulk API;
fills use asyncio.gather). Delayed jobs need taskiq's separate scheduler process, whose
schedule sources are polled; that workload is left out for taskiq."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import peerlib
from taskiq_redis import RedisStreamBroker

NAME = "taskiq"
PACKAGES = ("taskiq", "taskiq-redis", "redis")
CONFIG = ("`taskiq worker peer_taskiq:broker --workers N` (RedisStreamBroker, defaults); "
          "I/O: `--max-async-tasks 100`; a Redis result backend for the payload row; `kiq()` "
          "one by one (no bulk API; fills gather)")
BULK = False

broker = RedisStreamBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
                           queue_name=peerlib.QUEUE)
if peerlib.store_results():  # the payload row: every system keeps its results there
    from taskiq_redis import RedisAsyncResultBackend

    broker = broker.with_result_backend(RedisAsyncResultBackend(
        redis_url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
        result_ex_time=3600))


@broker.task(task_name="noop")
async def noop() -> None:
    peerlib.count()


@broker.task(task_name="record")
async def record(t: float) -> None:
    peerlib.record(t)


@broker.task(task_name="work")
async def work(kind: str, data: Any = None) -> Any:
    return await peerlib.awork(kind, data)


class Producer:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(broker.startup())

    def enqueue(self, kind: str, t: float | None = None) -> None:
        self.loop.run_until_complete(noop.kiq() if kind == "noop" else record.kiq(t))

    def enqueue_delayed(self, t: float, delay: float) -> None:
        raise NotImplementedError("taskiq delays need its scheduler process: not measured")

    def _gather(self, make: Any, n: int) -> None:
        async def run(k: int) -> None:
            await asyncio.gather(*(make() for _ in range(k)))
        for i in range(0, n, 500):
            self.loop.run_until_complete(run(min(500, n - i)))

    def fill(self, n: int) -> None:
        self._gather(noop.kiq, n)

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        self._gather(lambda: work.kiq(kind, data), n)

    def fill_delayed(self, delays: list[float]) -> None:
        raise NotImplementedError("taskiq delays need its scheduler process: not measured")

    def close(self) -> None:
        self.loop.run_until_complete(broker.shutdown())
        self.loop.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "taskiq")
    argv = [exe, "worker", "peer_taskiq:broker", "--workers", str(processes),
            "--log-level", "WARNING"]
    if purpose == "io" or os.environ.get("BENCH_CONCURRENCY"):
        argv += ["--max-async-tasks", str(peerlib.concurrency(100))]
    return [argv]
