"""Dramatiq: `dramatiq peer_dramatiq --processes N --threads 2` with
``dramatiq_queue_prefetch=256``, RedisBroker, JSON encoder (its default), `send()` (no bulk
API), `send_with_options(delay=)`.

Its best setting for short jobs: the Redis consumer prefetches 2 × threads messages by
default and backs off (≥ 5 ms) while that many are outstanding, so throughput follows the
thread count; the documented ``dramatiq_queue_prefetch`` variable lifts the cap, and two
threads keep the GIL's hand-offs few. I/O jobs keep a thread per job in flight (--threads
N, prefetch left at its default). The payload row keeps results (the Results middleware
on a Redis backend), as every system does there."""

from __future__ import annotations

import os
import sys
from typing import Any

import dramatiq
import peerlib
from dramatiq.brokers.redis import RedisBroker

NAME = "dramatiq"
PACKAGES = ("dramatiq", "redis")
CONFIG = ("`dramatiq peer_dramatiq --processes N --threads 2`, dramatiq_queue_prefetch=256 "
          "(I/O: --threads 100, default prefetch); RedisBroker, JSON; results in Redis for the "
          "payload row; `send()` one by one (no bulk API), `send_with_options(delay=ms)`")
PREFETCH = 256
DRAIN_THREADS = 2
BULK = False

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))
if peerlib.store_results():
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    broker.add_middleware(Results(backend=RedisBackend(client=broker.client)))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=peerlib.QUEUE)
def noop() -> None:
    peerlib.count()


@dramatiq.actor(queue_name=peerlib.QUEUE)
def record(t: float) -> None:
    peerlib.record(t)


@dramatiq.actor(queue_name=peerlib.QUEUE,
                **({"store_results": True} if peerlib.store_results() else {}))
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


def worker_env(purpose: str) -> dict[str, str]:
    """The documented prefetch variable, for every purpose but I/O (a thread per job)."""
    return {} if purpose == "io" else {"dramatiq_queue_prefetch": str(PREFETCH)}


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "dramatiq")
    threads = peerlib.concurrency(100) if purpose == "io" else DRAIN_THREADS
    return [[exe, "peer_dramatiq", "--processes", str(processes), "--threads", str(threads)]]
