"""The queue-wide limit across the supervisor's processes."""

from __future__ import annotations

from collections.abc import Callable

import redis

import echomq

from .conftest import Supervisor, wait_until


def test_max_active_holds_across_processes_and_every_job_runs(
        supervisor: Callable[..., Supervisor], redis_url: str, queue_name: str,
        r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(max_active=2)
    ids = [q.add("x", {"gate": True}, lane=f"l{i % 3}") for i in range(6)]
    supervisor(redis_url, queue_name, "--processes", "2", "--concurrency", "3").started(2)
    started = f"ledger:{queue_name}:started"
    for n in range(2, 7, 2):
        wait_until(lambda n=n: r.llen(started) == n, 15, f"{n} jobs to start")
        assert q.counts()["active"] == 2  # never a third beside them
        r.rpush(f"ledger:{queue_name}:gate", "go", "go")
    wait_until(lambda: q.counts()["completed"] == 6, 15, "every job to complete")
    assert r.llen(started) == 6 and sorted(
        d.decode() for d in r.lrange(f"ledger:{queue_name}:done", 0, -1)) == sorted(ids)
