"""A handler that makes the server refuse writes and asks its own process to stop."""

from __future__ import annotations

import os
import signal

import redis

_client: redis.Redis | None = None
_pid = 0


def refuse_and_stop(job) -> str:  # type: ignore[no-untyped-def]
    """Record the start; with payload {"refuse": true}, the first time only: pause the
    supervisor (SIGSTOP: only this process talks to the server until the test lets it go
    on), make the server refuse writes (min-replicas-to-write) and SIGTERM this consumer,
    as a deploy would, then return."""
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client = redis.Redis.from_url(os.environ["ECHOMQ_TEST_LEDGER_URL"])
        _pid = os.getpid()
    _client.rpush(f"ledger:{job.queue}:started", job.id)
    if isinstance(job.payload, dict) and job.payload.get("refuse") and \
            _client.set(f"ledger:{job.queue}:refused", 1, nx=True):
        os.kill(os.getppid(), signal.SIGSTOP)
        _client.config_set("min-replicas-to-write", 1)
        os.kill(os.getpid(), signal.SIGTERM)
    return "ok"
