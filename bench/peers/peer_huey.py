"""huey: `huey_consumer peer_huey.huey -k process -w N` (RedisHuey, blocking pops, its
pickle serializer), `task()` one by one (no bulk API), `schedule(delay=)` for delays.

Worker types, each as huey's documentation advises: ``process`` workers for the drains
(CPU-bound, one job at a time per process), ``greenlet`` workers (gevent, 100 per
process) for the I/O-bound workload; ``peer_huey_thread`` runs the ``thread`` type."""

from __future__ import annotations

import os
import sys
from typing import Any

import peerlib
from huey import RedisHuey

NAME = "huey"
PACKAGES = ("huey", "redis")
CONFIG = ("`huey_consumer -k process -w N` (RedisHuey: blocking pop, defaults); I/O: "
          "`-k greenlet -w 100` per process; `task()` one by one (no bulk API), `schedule(delay=)`")
BULK = False
WORKER_TYPE = "process"

huey = RedisHuey(peerlib.QUEUE, url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))


@huey.task()
def noop() -> None:
    peerlib.count()


@huey.task()
def record(t: float) -> None:
    peerlib.record(t)


@huey.task()
def work(kind: str, data: Any = None) -> Any:
    return peerlib.work(kind, data)


class Producer:
    def __init__(self, url: str) -> None:
        pass  # the module-level huey already points at BENCH_REDIS_URL

    def enqueue(self, kind: str, t: float | None = None) -> None:
        if kind == "noop":
            noop()
        else:
            record(t)

    def enqueue_delayed(self, t: float, delay: float) -> None:
        record.schedule(args=(t,), delay=delay)

    def fill(self, n: int) -> None:
        for _ in range(n):
            noop()

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        for _ in range(n):
            work(kind, data)

    def fill_delayed(self, delays: list[float]) -> None:
        for d in delays:
            noop.schedule(delay=d)

    def close(self) -> None:
        huey.storage.conn.close()


GREENLET_CONSUMER = ("from gevent import monkey; monkey.patch_all()\n"
                     "from huey.bin.huey_consumer import consumer_main; consumer_main()")


def consumer_argvs(module: str, worker_type: str, processes: int,
                   purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
    if purpose == "io":  # greenlet workers need gevent's monkey-patch first (huey's docs)
        return [[sys.executable, "-c", GREENLET_CONSUMER, f"{module}.huey", "-k", "greenlet",
                 "-w", str(peerlib.concurrency(100)), "-q"] for _ in range(processes)]
    if worker_type == "process":
        return [[exe, f"{module}.huey", "-k", "process", "-w", str(processes), "-q"]]
    return [[exe, f"{module}.huey", "-k", "thread", "-w", str(peerlib.concurrency(4)), "-q"]
            for _ in range(processes)]


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    return consumer_argvs("peer_huey", WORKER_TYPE, processes, purpose)
