"""EchoMQ in the peers harness: ``echomq-supervisor start --processes N``, this module's
``handle`` as the handler (it dispatches on the job name), ``Queue.add`` / ``add_many``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import peerlib

NAME = "echomq"
PACKAGES = ("echomq", "redis")
CONFIG = ("`echomq-supervisor start --processes N` (beat 1000 ms, lease 30 s, defaults); "
          "`Queue.add`, bulk `Queue.add_many`; JSON payloads (its only format)")
BULK = True


def handle(job: Any) -> Any:
    if job.name == "noop":
        peerlib.count()
    elif job.name in peerlib.KINDS:
        return peerlib.work(job.name, job.payload)
    else:
        peerlib.record(job.payload["t"])
    return None


async def ahandle(job: Any) -> Any:
    """The I/O workload's handler: a coroutine, run --concurrency at a time per process."""
    return await peerlib.awork(job.name, job.payload)


class Producer:
    def __init__(self, url: str) -> None:
        import echomq

        self.q = echomq.Queue(peerlib.QUEUE, redis_url=url)

    def enqueue(self, kind: str, t: float | None = None) -> None:
        self.q.add(kind, {"t": t} if t is not None else None)

    def enqueue_delayed(self, t: float, delay: float) -> None:
        self.q.add("record", {"t": t}, delay=delay)

    def enqueue_bulk(self, n: int) -> None:
        for i in range(0, n, 5000):
            self.q.add_many([("noop", None)] * min(5000, n - i))

    def enqueue_bulk_lanes(self, n: int, lanes: int) -> None:
        for i in range(0, n, 5000):
            self.q.add_many([("noop", None, {"lane": f"l{(i + k) % lanes}"})
                             for k in range(min(5000, n - i))])

    def fill_kind(self, n: int, kind: str) -> None:
        data = peerlib.data_for(kind)
        for i in range(0, n, 5000):
            self.q.add_many([(kind, data)] * min(5000, n - i))

    def fill_delayed(self, delays: list[float]) -> None:
        for i in range(0, len(delays), 5000):
            self.q.add_many([("noop", None, {"delay": d}) for d in delays[i:i + 5000]])

    def close(self) -> None:
        self.q.close()


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    exe = Path(sys.executable).parent / "echomq-supervisor"
    argv = [str(exe), "start", "--redis-url", url, "--queue", peerlib.QUEUE,
            "--handler", "peer_echomq:handle", "--processes", str(processes),
            "--log-level", "WARNING"]
    if purpose == "io":  # async handlers, many in flight per process
        argv[argv.index("peer_echomq:handle")] = "peer_echomq:ahandle"
        argv += ["--concurrency", str(peerlib.concurrency(100))]
    return [argv]
