"""Dramatiq: `dramatiq peer_dramatiq --processes N` (8 threads per process, its default),
RedisBroker, JSON encoder (its default), `send()` (no bulk API), `send_with_options(delay=)`."""

from __future__ import annotations

import os
import sys
from typing import Any

import dramatiq
import peerlib
from dramatiq.brokers.redis import RedisBroker

NAME = "dramatiq"
PACKAGES = ("dramatiq", "redis")
CONFIG = ("`dramatiq peer_dramatiq --processes N` (8 threads each, defaults); RedisBroker, "
          "JSON; `send()` one by one (no bulk API), `send_with_options(delay=ms)`")
BULK = False

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=peerlib.QUEUE)
def noop() -> None:
    peerlib.count()


@dramatiq.actor(queue_name=peerlib.QUEUE)
def record(t: float) -> None:
    peerlib.record(t)


@dramatiq.actor(queue_name=peerlib.QUEUE)
def work(kind: str, data: Any = None) -> None:
    peerlib.work(kind, data)


class Producer:
    def __init__(self, url: str) -> None:
        pass  # the module-level broker already points at BENCH_REDIS_URL

    def enqueue(self, kind: str, t: float | None = None) -> None:
        if kind == "noop":
            noop.send()
        else:
            record.send(t)

    def enqueue_delayed(self, t: float, delay: float) -> None:
        record.send_with_options(args=(t,), delay=int(delay * 1000))

    def fill(self, n: int) -> None:
        for _ in range(n):
            noop.send()

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        for _ in range(n):
            work.send(kind, data)

    def fill_delayed(self, delays: list[float]) -> None:
        for d in delays:
            noop.send_with_options(delay=int(d * 1000))

    def close(self) -> None:
        broker.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "dramatiq")
    argv = [exe, "peer_dramatiq", "--processes", str(processes)]
    if purpose == "io":
        argv += ["--threads", str(peerlib.concurrency(100))]
    return [argv]
