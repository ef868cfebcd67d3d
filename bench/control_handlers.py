"""Handlers for bench/control.py, run by the supervisor (with ``bench/`` as its working
directory): each says it started (``bench:ctl:started`` gets "<job id>:<pid>") and then
waits until it is cancelled."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

_client: redis.Redis | None = None
_pid = 0


def _redis() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():  # built after the fork
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        _pid = os.getpid()
    return _client


def block(job: Any) -> None:
    """A sync handler stuck in a blocking call (ended only with its process)."""
    r = _redis()
    r.rpush("bench:ctl:started", f"{job.id}:{os.getpid()}")
    r.blpop(["bench:ctl:never"], 120)


async def wait(job: Any) -> None:
    """An async handler awaiting; it records when its cancel reached it (wall clock)."""
    _redis().rpush("bench:ctl:started", f"{job.id}:{os.getpid()}")
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        _redis().rpush("bench:ctl:ended", repr(time.time()))
        raise
