"""BullMQ (Python package): one `python peer_bullmq.py` process per worker, each a
`bullmq.Worker` (concurrency 1, its default), `Queue.add` / bulk `addBulk`, `delay` in ms;
completed jobs auto-removed past 1,000 as BullMQ's production guide recommends."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import peerlib

NAME = "bullmq"
PACKAGES = ("bullmq", "redis")
CONFIG = ("N × a `bullmq.Worker` process (concurrency 1, defaults); `add`, bulk `addBulk`, "
          "`delay`; removeOnComplete 1000 (production guide); JSON (its format)")
BULK = True
OPTS = {"removeOnComplete": 1000, "removeOnFail": 5000}


async def process(job: Any, token: str) -> Any:
    if job.name == "noop":
        peerlib.count()
    elif job.name in peerlib.KINDS:
        return await peerlib.awork(job.name, job.data.get("d"))
    else:
        peerlib.record(job.data["t"])
    return None


async def _serve(url: str) -> None:
    from bullmq import Worker

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(peerlib.QUEUE, process,
                    {"connection": url, "concurrency": peerlib.concurrency(1)})
    await stop.wait()
    await worker.close()


class Producer:
    def __init__(self, url: str) -> None:
        from bullmq import Queue

        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.q = Queue(peerlib.QUEUE, {"connection": url})

    def enqueue(self, kind: str, t: float | None = None) -> None:
        self.loop.run_until_complete(self.q.add(kind, {"t": t}, OPTS))

    def enqueue_delayed(self, t: float, delay: float) -> None:
        self.loop.run_until_complete(
            self.q.add("record", {"t": t}, {**OPTS, "delay": int(delay * 1000)}))

    def enqueue_bulk(self, n: int) -> None:
        for i in range(0, n, 1000):
            self.loop.run_until_complete(self.q.addBulk(
                [{"name": "noop", "data": {}, "opts": OPTS} for _ in range(min(1000, n - i))]))

    def fill_kind(self, n: int, kind: str) -> None:
        data = {"d": peerlib.data_for(kind)}
        for i in range(0, n, 1000):
            self.loop.run_until_complete(self.q.addBulk(
                [{"name": kind, "data": data, "opts": OPTS} for _ in range(min(1000, n - i))]))

    def fill_delayed(self, delays: list[float]) -> None:
        for i in range(0, len(delays), 1000):
            self.loop.run_until_complete(self.q.addBulk(
                [{"name": "noop", "data": {}, "opts": {**OPTS, "delay": int(d * 1000)}}
                 for d in delays[i:i + 1000]]))

    def close(self) -> None:
        self.loop.run_until_complete(self.q.close())
        self.loop.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    return [[sys.executable, os.path.abspath(__file__), "worker", url] for _ in range(processes)]


if __name__ == "__main__" and len(sys.argv) >= 3 and sys.argv[1] == "worker":
    asyncio.run(_serve(sys.argv[2]))
