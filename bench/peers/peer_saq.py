"""SAQ: `saq peer_saq.settings --workers N` (asyncio, concurrency 50, JSON by default),
`Queue.enqueue` (no bulk API), `scheduled=` epoch seconds for delays.

Its best settings: concurrency 50 per process (10 by default) and each job enqueued with
``ttl=-1`` (SAQ's job field: the job's hash, result included, is not kept after it
finishes; the default keeps it 600 s), but for the payload row, where every system keeps
its results."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import peerlib

NAME = "saq"
PACKAGES = ("saq", "redis")
CONFIG = ("`saq peer_saq.settings --workers N` (concurrency 50, schedule poll 1 s, JSON); "
          "`enqueue(..., ttl=-1)` but for the payload row, one by one (no bulk API; fills use "
          "asyncio.gather), `scheduled=`")
TTL = 600 if peerlib.store_results() else -1  # -1: not kept once done; 600 s: its default
BULK = False


async def noop(ctx: dict[str, Any]) -> None:
    peerlib.count()


async def record(ctx: dict[str, Any], *, t: float) -> None:
    peerlib.record(t)


async def work(ctx: dict[str, Any], *, kind: str, data: Any = None) -> Any:
    return await peerlib.awork(kind, data)


def _queue(url: str) -> Any:
    from saq import Queue

    return Queue.from_url(url, name=peerlib.QUEUE)


settings = {
    "queue": _queue(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")),
    "functions": [noop, record, work],
    "concurrency": peerlib.concurrency(50),
}


class Producer:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.q = _queue(url)
        if hasattr(self.q, "connect"):  # SAQ < 0.9 (later ones connect on first use)
            self.loop.run_until_complete(self.q.connect())

    def enqueue(self, kind: str, t: float | None = None) -> None:
        if kind == "noop":
            self.loop.run_until_complete(self.q.enqueue("noop", ttl=TTL))
        else:
            self.loop.run_until_complete(self.q.enqueue("record", t=t, ttl=TTL))

    def enqueue_delayed(self, t: float, delay: float) -> None:
        self.loop.run_until_complete(
            self.q.enqueue("record", t=t, scheduled=time.time() + delay, ttl=TTL))

    def _gather(self, coros: list[Any]) -> None:
        async def run() -> None:
            await asyncio.gather(*coros)
        self.loop.run_until_complete(run())

    def fill(self, n: int) -> None:
        for i in range(0, n, 500):
            self._gather([self.q.enqueue("noop", ttl=TTL) for _ in range(min(500, n - i))])

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        for i in range(0, n, 500):
            self._gather([self.q.enqueue("work", kind=kind, data=data, ttl=TTL)
                          for _ in range(min(500, n - i))])

    def fill_delayed(self, delays: list[float]) -> None:
        now = time.time()
        for i in range(0, len(delays), 500):
            self._gather([self.q.enqueue("noop", scheduled=now + d) for d in delays[i:i + 500]])

    def close(self) -> None:
        self.loop.run_until_complete(self.q.disconnect())
        self.loop.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "saq")
    return [[exe, "peer_saq.settings", "--workers", str(processes), "--quiet"]]
