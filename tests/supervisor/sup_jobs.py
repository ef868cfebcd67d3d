"""Handlers the supervisor tests run in real forked consumers.

Each records into Redis lists under ``ledger:<queue>:*`` (URL from
ECHOMQ_TEST_LEDGER_URL) so tests count executions from evidence.
"""

from __future__ import annotations

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
    """Payload options: sleep (s), exit (code, via os._exit), exit_first (the same on attempt
    1 only), stamp (push start time)."""
    r = _ledger()
    p = job.payload if isinstance(job.payload, dict) else {}
    r.rpush(f"ledger:{job.queue}:started", f"{job.id}:{os.getpid()}:{job.attempts}")
    if p.get("stamp"):
        r.rpush(f"ledger:{job.queue}:stamps", repr(time.time()))
    if p.get("fail_first") and job.attempts == 1:
        raise RuntimeError("first attempt fails")
    if "exit" in p:
        os._exit(int(p["exit"]))
    if "exit_first" in p and job.attempts == 1:
        os._exit(int(p["exit_first"]))
    if p.get("sleep"):
        time.sleep(float(p["sleep"]))  # simulated work inside the job
    r.rpush(f"ledger:{job.queue}:done", job.id)
    return "ok"
