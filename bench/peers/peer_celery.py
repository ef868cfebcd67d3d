"""Celery: N × `celery -A peer_celery worker -P solo` (one instance per process), Redis
broker, JSON serializer, results ignored but in the payload row (a Redis result backend
there, as every system keeps results in that row); `delay()` (no bulk API),
`apply_async(countdown=)` for delays (ETA tasks wait in the worker's memory).

Its best setting for short jobs: with the prefork pool (`-c N`) one main process reads the
broker and hands every job to a pool child over a pipe, and its ~900 µs of CPU per job is
the bottleneck; the solo pool runs each job in the process that reads it, so N solo
instances (as the other adapters run N worker processes) scale with N. I/O jobs use the
threads pool, one instance per process."""

from __future__ import annotations

import os
import sys
from typing import Any

import peerlib
from celery import Celery

NAME = "celery"
PACKAGES = ("celery", "kombu", "redis")
CONFIG = ("N × `celery -A peer_celery worker -P solo` (I/O: -P threads); task_ignore_result "
          "but for the payload row (Redis result backend), JSON; `delay()` one by one "
          "(no bulk API), `countdown=`")
BULK = False

app = Celery("peer_celery", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))
app.conf.update(task_ignore_result=not peerlib.store_results(), task_serializer="json",
                accept_content=["json"], broker_connection_retry_on_startup=True,
                task_default_queue=peerlib.QUEUE)
if peerlib.store_results():
    app.conf.result_backend = app.conf.broker_url


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
        if peerlib.store_results():
            app.conf.result_backend = url

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
    return [[exe, "-A", "peer_celery", "worker", "-P", "solo", "-n", f"solo{i}@%h",
             "--loglevel", "WARNING"] for i in range(processes)]
