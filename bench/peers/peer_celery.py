"""Celery: `celery -A peer_celery worker -c N` (prefork pool, prefetch multiplier 4, its
defaults), Redis broker, JSON serializer, results ignored; `delay()` (no bulk API),
`apply_async(countdown=)` for delays (ETA tasks wait in the worker's memory)."""

from __future__ import annotations

import os
import sys
from typing import Any

import peerlib
from celery import Celery

NAME = "celery"
PACKAGES = ("celery", "kombu", "redis")
CONFIG = ("`celery -A peer_celery worker -c N` (prefork, prefetch ×4, defaults); "
          "task_ignore_result, JSON; `delay()` one by one (no bulk API), `countdown=`")
BULK = False

app = Celery("peer_celery", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))
app.conf.update(task_ignore_result=True, task_serializer="json", accept_content=["json"],
                broker_connection_retry_on_startup=True, task_default_queue=peerlib.QUEUE)


@app.task(name="noop")
def noop() -> None:
    peerlib.count()


@app.task(name="record")
def record(t: float) -> None:
    peerlib.record(t)


@app.task(name="work")
def work(kind: str, data: Any = None) -> Any:
    return peerlib.work(kind, data)


class Producer:
    def __init__(self, url: str) -> None:
        app.conf.broker_url = url

    def enqueue(self, kind: str, t: float | None = None) -> None:
        if kind == "noop":
            noop.delay()
        else:
            record.delay(t)

    def enqueue_delayed(self, t: float, delay: float) -> None:
        record.apply_async((t,), countdown=delay)

    def fill(self, n: int) -> None:
        for _ in range(n):
            noop.delay()

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        for _ in range(n):
            work.delay(kind, data)

    def fill_delayed(self, delays: list[float]) -> None:
        for d in delays:
            noop.apply_async(countdown=d)

    def close(self) -> None:
        app.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "celery")
    if purpose == "io":  # the threads pool, one worker per process, N threads each
        return [[exe, "-A", "peer_celery", "worker", "-P", "threads", "-c",
                 str(peerlib.concurrency(100)), "-n", f"io{i}@%h", "--loglevel", "WARNING"]
                for i in range(processes)]
    return [[exe, "-A", "peer_celery", "worker", "-c", str(processes), "--loglevel", "WARNING"]]
