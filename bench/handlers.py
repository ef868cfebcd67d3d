"""No-op and recording handlers for the EchoMQ benchmarks (``handlers:noop``, ``handlers:record``).

The supervisor imports them with ``bench/`` as its working directory. ``record``
pushes ``time.time() - payload["t"]`` (seconds) onto the ``bench:lat`` list: with
``t`` the admit time it is the pickup latency, with ``t`` the due time the lateness.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

_client: redis.Redis | None = None


def noop(job: Any) -> None:
    return None


def _redis() -> redis.Redis:
    global _client
    if _client is None:  # built lazily, so after the supervisor forked this process
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    return _client


def record(job: Any) -> None:
    started = time.time()
    _redis().rpush("bench:lat", f"{started - float(job.payload['t']):.6f}")


async def io_async(job: Any) -> None:
    """I/O-bound work: wait ``payload["s"]`` seconds (default 0.05) without blocking the loop;
    a job named ``probe`` records its pickup latency instead."""
    import asyncio

    if job.name == "probe":
        record(job)
        return
    await asyncio.sleep(float((job.payload or {}).get("s", 0.05)))


def io_sync(job: Any) -> None:
    """The blocking twin of :func:`io_async`, for a pool of threads."""
    if job.name == "probe":
        record(job)
        return
    time.sleep(float((job.payload or {}).get("s", 0.05)))  # the simulated I/O wait itself
