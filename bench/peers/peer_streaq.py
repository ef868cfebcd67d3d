"""streaq: `streaq run peer_streaq:worker --workers N` (asyncio on Redis streams;
concurrency 16 per process, its default), `task.enqueue()` / bulk `Worker.enqueue_many`,
`.start(delay=)` for delays.

Its best settings (the task decorator's documented options): ``silent=True`` (it logs two
INFO lines per job otherwise) and ``ttl=0`` (no result stored; the default keeps each for
five minutes), but for the payload row, where every system keeps its results."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

import peerlib
from streaq import Worker

NAME = "streaq"
PACKAGES = ("streaq", "coredis")
CONFIG = ("`streaq run peer_streaq:worker --workers N` (concurrency 16); tasks silent=True, "
          "ttl=0 but for the payload row; I/O: concurrency 100 per process; `enqueue`, bulk "
          "`enqueue_many`, `.start(delay=)`")
TASK = {"silent": True, "ttl": timedelta(minutes=5) if peerlib.store_results() else 0}
BULK = True

worker: Worker[Any] = Worker(
    redis_url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
    queue_name=peerlib.QUEUE, concurrency=peerlib.concurrency(16))


@worker.task(**TASK)
async def noop() -> None:
    peerlib.count()


@worker.task(**TASK)
async def record(t: float) -> None:
    peerlib.record(t)


@worker.task(**TASK)
async def work(kind: str, data: Any = None) -> Any:
    return await peerlib.awork(kind, data)


class Producer:
    """Enqueues from a loop thread that holds the worker's client open (`async with worker`)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.closing = asyncio.Event()
        self.holder = asyncio.run_coroutine_threadsafe(self._hold(), self.loop)
        self.ready.wait(30)

    async def _hold(self) -> None:
        async with worker:
            self.ready.set()
            await self.closing.wait()

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(300)

    def enqueue(self, kind: str, t: float | None = None) -> None:
        async def one() -> None:
            await (noop.enqueue() if kind == "noop" else record.enqueue(t))
        self._run(one())

    def enqueue_delayed(self, t: float, delay: float) -> None:
        async def one() -> None:
            await record.enqueue(t).start(delay=timedelta(seconds=delay))
        self._run(one())

    def _many(self, make: Any, n: int) -> None:
        async def batch(k: int) -> None:
            await worker.enqueue_many([make() for _ in range(k)])
        for i in range(0, n, 1000):
            self._run(batch(min(1000, n - i)))

    def enqueue_bulk(self, n: int) -> None:
        self._many(noop.enqueue, n)

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        self._many(lambda: work.enqueue(kind, data), n)

    def fill_delayed(self, delays: list[float]) -> None:
        async def batch(chunk: list[float]) -> None:
            for d in chunk:
                await noop.enqueue().start(delay=timedelta(seconds=d))
        for i in range(0, len(delays), 1000):
            self._run(batch(delays[i:i + 1000]))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.closing.set)
        with contextlib.suppress(Exception):
            self.holder.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "streaq")
    return [[exe, "run", "peer_streaq:worker", "--workers", str(processes)]]
