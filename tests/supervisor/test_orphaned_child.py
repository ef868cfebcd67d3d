"""A consumer whose supervisor died (SIGKILL) starts nothing more: it finishes the job it
was running, hands back the rest of its batch uncharged and leaves. Nobody extends its
leases any more, so a job it started would be reaped under the next supervisor and
charged a stall it did not cause (one at max_stalls would go dead without its run)."""

from __future__ import annotations

from typing import Any

import psutil
import redis

import echomq

from .conftest import wait_until


def test_a_consumer_left_by_its_supervisor_hands_its_batch_back_and_leaves(
        supervisor: Any, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis=r, max_stalls=0)
    ids = q.add_many([("x", {"gate": True}, {"job_id": f"j{i}"}) for i in range(3)])
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    started = f"ledger:{queue_name}:started"
    wait_until(lambda: r.llen(started) == 1, 15, "the first job to start")
    [child] = psutil.Process(sup.proc.pid).children()
    sup.proc.kill()
    sup.proc.wait(10)
    r.rpush(f"ledger:{queue_name}:gate", "go")  # the running job may finish
    child.wait(15)  # psutil.TimeoutExpired: it went on with its batch
    assert r.llen(started) == 1, r.lrange(started, 0, -1)
    first = r.lrange(started, 0, 0)[0].decode().split(":")[0]
    wait_until(lambda: q.get(first).state == "completed", 10, "the finished job settled")
    for job_id in set(ids) - {first}:
        job = q.get(job_id)
        assert job is not None and (job.state, job.stalls) == ("waiting", 0), job
