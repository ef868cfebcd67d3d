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


def started(job: Any) -> None:
    """Push ``"<payload i> <start time>"`` onto ``bench:start``: for a stamp the producer
    can only take after the job is written (e.g. when its transaction's commit returns)."""
    _redis().rpush("bench:start", f"{job.payload['i']} {time.time():.6f}")


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


_observed: dict[str, float] = {"jobs": 0, "ran_s": 0.0, "running": 0, "busy_s": 0.0,
                               "first": 0.0, "last": 0.0}


def _observe_slots() -> float:
    """Add (jobs running) × (time since the last start or end) to the busy integral."""
    now = time.monotonic()
    if _observed["first"]:
        _observed["busy_s"] += _observed["running"] * (now - _observed["last"])
    else:
        _observed["first"] = now
    _observed["last"] = now
    return now


async def io_async_observed(job: Any) -> None:
    """:func:`io_async` that also keeps, per process, how long its waits really took (the
    event loop's lag included) and the time-integral of jobs running (slots busy), written
    every 200 jobs to the hash ``bench:io:<pid>`` (jobs, ran_s, busy_s, window_s)."""
    import asyncio

    if job.name == "probe":
        record(job)
        return
    started = _observe_slots()
    _observed["running"] += 1
    await asyncio.sleep(float((job.payload or {}).get("s", 0.05)))
    ended = _observe_slots()
    _observed["running"] -= 1
    _observed["jobs"] += 1
    _observed["ran_s"] += ended - started
    if _observed["jobs"] % 200 == 0:
        _redis().hset(f"bench:io:{os.getpid()}", mapping={
            "jobs": _observed["jobs"], "ran_s": _observed["ran_s"],
            "busy_s": _observed["busy_s"], "window_s": _observed["last"] - _observed["first"]})
