"""What every system's handlers share: counting completions and recording start times.

Stdlib and redis-py only, so it imports under every virtualenv of the harness.

* ``count()`` appends one byte to the file named by ``BENCH_COUNT_FILE`` (opened
  once per process, O_APPEND, so concurrent writers never lose a byte): the
  driver reads the file's size as "jobs completed", the same way for every
  system, without adding a Redis command per job.
* ``record(t)`` pushes ``time.time() - t`` onto the Redis list ``bench:lat``:
  with ``t`` the admit time it is the pickup latency, with ``t`` the due time
  the lateness.
"""

from __future__ import annotations

import os
import time

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
