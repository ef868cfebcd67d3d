"""huey with its ``thread`` worker type: one `huey_consumer -k thread -w 4` per process
(threads share the GIL, so more processes, not more threads, add throughput)."""

from __future__ import annotations

from peer_huey import BULK, PACKAGES, Producer, consumer_argvs, huey, noop, record, work

NAME = "huey_thread"
CONFIG = ("N × `huey_consumer -k thread -w 4` (RedisHuey, defaults otherwise); I/O: "
          "`-k greenlet -w 100` per process")
__all__ = ["BULK", "PACKAGES", "Producer", "huey", "noop", "record", "work", "worker_argvs"]


def worker_argvs(processes: int, url: str, purpose: str) -> list[list[str]]:
    return consumer_argvs("peer_huey_thread", "thread", processes, purpose)
