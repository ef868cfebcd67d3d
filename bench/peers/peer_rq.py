"""RQ: `rq worker -w rq.worker.SimpleWorker` processes (one job at a time each), JSON
serializer, `Queue.enqueue` / bulk `Queue.enqueue_many`; delayed jobs need a worker started
`--with-scheduler`.

Its best setting for short jobs: the default Worker forks a work horse per job; RQ's own
performance notes say SimpleWorker, which runs jobs in the worker process, suits jobs of a
few milliseconds. In the workload rows results are kept (``result_ttl`` 500 s, its
default) only for the payload kind, as every system keeps them there, else ``result_ttl=0``;
the no-op fills keep RQ's default."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import peerlib

NAME = "rq"
PACKAGES = ("rq", "redis")
CONFIG = ("N × `rq worker -S json -w rq.worker.SimpleWorker` (no fork per job); "
          "`--with-scheduler` on one worker for delayed jobs; `enqueue`, bulk `enqueue_many`; "
          "result_ttl 0 but for the payload row")
BULK = True
# BENCH_RQ_WORKER=rq.worker.Worker runs the forking default, for a side-by-side check
WORKER_CLASS = os.environ.get("BENCH_RQ_WORKER", "rq.worker.SimpleWorker")
RESULT_TTL = 500 if peerlib.store_results() else 0
HERE = str(Path(__file__).resolve().parent)


def noop() -> None:
    peerlib.count()


def record(t: float) -> None:
    peerlib.record(t)


def work(kind: str, data: Any = None) -> Any:
    return peerlib.work(kind, data)


class Producer:
    def __init__(self, url: str) -> None:
        import redis
        from rq import Queue
        from rq.serializers import JSONSerializer

        self.r = redis.Redis.from_url(url)
        self.q = Queue(peerlib.QUEUE, connection=self.r, serializer=JSONSerializer)

    def enqueue(self, kind: str, t: float | None = None) -> None:
        if kind == "noop":
            self.q.enqueue("peer_rq.noop")
        else:
            self.q.enqueue("peer_rq.record", t)

    def enqueue_delayed(self, t: float, delay: float) -> None:
        self.q.enqueue_in(timedelta(seconds=delay), "peer_rq.record", t)

    def enqueue_bulk(self, n: int) -> None:
        from rq import Queue

        for i in range(0, n, 1000):
            self.q.enqueue_many([Queue.prepare_data("peer_rq.noop")
                                 for _ in range(min(1000, n - i))])

    def fill_kind(self, n: int, kind: str) -> None:
        from rq import Queue

        data = peerlib.data_for(kind)
        for i in range(0, n, 1000):
            self.q.enqueue_many([Queue.prepare_data("peer_rq.work", (kind, data),
                                                    result_ttl=RESULT_TTL)
                                 for _ in range(min(1000, n - i))])

    def fill_delayed(self, delays: list[float]) -> None:
        for i in range(0, len(delays), 1000):
            pipe = self.r.pipeline()
            for d in delays[i:i + 1000]:
                self.q.enqueue_in(timedelta(seconds=d), "peer_rq.noop", pipeline=pipe)
            pipe.execute()

    def close(self) -> None:
        self.r.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = os.path.join(os.path.dirname(sys.executable), "rq")
    out = []
    for i in range(processes):
        argv = [exe, "worker", "-u", url, "-S", "json", "-P", HERE, "--logging_level",
                "WARNING", "-w", WORKER_CLASS, peerlib.QUEUE]
        if purpose == "delayed" and i == 0:
            argv.insert(2, "--with-scheduler")
        out.append(argv)
    return out
