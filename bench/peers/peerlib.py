"""What every system's handlers share: counting completions and recording start times.

Stdlib and redis-py only, so it imports under every virtualenv of the harness.

* ``count()`` appends one byte to the file named by ``BENCH_COUNT_FILE`` (opened
  once per process, O_APPEND, so concurrent writers never lose a byte): the
  driver reads the file's size as "jobs completed", the same way for every
  system, without adding a Redis command per job.
* ``record(t)`` pushes ``time.time() - t`` onto the Redis list ``bench:lat``:
  with ``t`` the admit time it is the pickup latency, with ``t`` the due time
  the lateness.
* ``work(kind, data)`` / ``awork(kind, data)`` are the job bodies of the
  drain workloads that look like real jobs (``KINDS``): ``payload`` takes a
  1 KiB JSON payload and returns a 200-byte result, ``cpu`` spins ~100 µs of
  pure-Python arithmetic, ``io`` waits 50 ms (``time.sleep`` in the sync body,
  ``asyncio.sleep`` in the async one); each then counts.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

LAT_KEY = "bench:lat"
_fd: int | None = None
_fd_pid: int | None = None
_client: redis.Redis | None = None
_client_pid: int | None = None


def count() -> None:
    global _fd, _fd_pid
    if _fd is None or _fd_pid != os.getpid():  # per process: workers fork after import
        _fd = os.open(os.environ["BENCH_COUNT_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                      0o644)
        _fd_pid = os.getpid()
    os.write(_fd, b".")


def record(t: float) -> None:
    started = time.time()
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        _client_pid = os.getpid()
    _client.rpush(LAT_KEY, f"{started - float(t):.6f}")


def redis_url() -> str:
    return os.environ["BENCH_REDIS_URL"]


QUEUE = "benchq"  # the queue name every system uses


KINDS = ("noop", "payload", "cpu", "io")
IO_WAIT_S = 0.05
CPU_LOOPS = 2_000  # ~100 µs of CPython 3.11 arithmetic on this kind of machine
PAYLOAD: dict[str, Any] = {"user": "u-0000042", "items": [{"sku": f"sku-{i:04d}", "qty": i % 7,
                                                           "note": "x" * 20}
                                                          for i in range(16)]}
RESULT: dict[str, Any] = {"status": "ok", "digest": "d" * 64, "detail": "r" * 100}


def data_for(kind: str) -> Any:
    """The job's argument for a kind: the 1 KiB payload for ``payload``, else None."""
    return PAYLOAD if kind == "payload" else None


def _spin() -> int:
    x = 0
    for i in range(CPU_LOOPS):
        x += i * i
    return x


def work(kind: str, data: Any = None) -> Any:
    """A synchronous job body of the given kind; returns the 200-byte result for payload."""
    if kind == "cpu":
        _spin()
    elif kind == "io":
        time.sleep(IO_WAIT_S)
    count()
    return RESULT if kind == "payload" else None


async def awork(kind: str, data: Any = None) -> Any:
    """The same as ``work`` for systems whose handlers are coroutines."""
    if kind == "io":
        await asyncio.sleep(IO_WAIT_S)
        count()
        return None
    return work(kind, data)


def store_results() -> bool:
    """True when the driver asks every system to keep each job's result (the payload
    row: EchoMQ always keeps a completed job's result, so every peer keeps its own too);
    otherwise each peer runs with results off where that is its best setting."""
    return os.environ.get("BENCH_STORE_RESULTS") == "1"


def concurrency(default: int) -> int:
    """In-flight jobs per worker process asked by the driver (``BENCH_CONCURRENCY``)."""
    return int(os.environ.get("BENCH_CONCURRENCY") or default)
