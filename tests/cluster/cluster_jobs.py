"""Handlers the cluster tests run in real forked consumers.

Each records into lists ``ledger:<queue>:done`` on a plain server (URL from
ECHOMQ_TEST_LEDGER_URL), outside the cluster, so a failover cannot erase the
evidence of what ran.
"""

from __future__ import annotations

import asyncio
import os
import time

import redis

_client: redis.Redis | None = None
_pid = 0


def _ledger() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client = redis.Redis.from_url(os.environ["ECHOMQ_TEST_LEDGER_URL"])
        _pid = os.getpid()
    return _client


def record(job) -> str:  # type: ignore[no-untyped-def]
    """Payload options: sleep (s), fail_first (raise on attempt 1)."""
    p = job.payload if isinstance(job.payload, dict) else {}
    if p.get("fail_first") and job.attempts == 1:
        raise RuntimeError("first attempt fails")
    if p.get("sleep"):
        time.sleep(float(p["sleep"]))  # simulated work inside the job
    _ledger().rpush(f"ledger:{job.queue}:done", job.id)
    return "ok"


async def record_async(job) -> str:  # type: ignore[no-untyped-def]
    """``record`` for the event loop of a concurrent consumer (``sleep`` awaited)."""
    p = job.payload if isinstance(job.payload, dict) else {}
    if p.get("fail_first") and job.attempts == 1:
        raise RuntimeError("first attempt fails")
    if p.get("sleep"):
        await asyncio.sleep(float(p["sleep"]))
    _ledger().rpush(f"ledger:{job.queue}:done", job.id)
    return "ok"
