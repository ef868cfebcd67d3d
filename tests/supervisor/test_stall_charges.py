"""What a job is charged when the supervisor, not the job, ends its run."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
import redis

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


@pytest.mark.xfail(strict=True, reason=(
    "a drain-timeout kill charges the running job a stall (arbiter._kill_all -> "
    "_release_child uses RELEASE_MODES, RUNNING -> 'stall', never reap.lua's 'requeue' "
    "mode meant for a drain that ran out of time): with max_stalls=1 the second rolling "
    "restart buries a healthy long job"))
def test_a_long_job_survives_two_drain_timeouts_without_going_dead(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"gate": True})  # runs until the test opens the gate
    for restart in (1, 2):
        sup = supervisor(redis_url, queue_name, "--processes", "1",
                         "--drain-timeout", "0.5").started(1)
        wait_until(lambda n=restart: r.llen(f"ledger:{queue_name}:started") == n, 15,
                   f"run {restart} of the long job")
        sup.signal(signal.SIGTERM)
        assert sup.wait(15) == 0
    job = q.get(job_id)
    assert job is not None
    assert job.state == "waiting", job  # requeued by both deploys, never failed or stalled
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 3, 15, "run 3")
    r.rpush(f"ledger:{queue_name}:gate", 1)
    wait_until(lambda: q.get(job_id).state == "completed", 15,  # type: ignore[union-attr]
               "the job to complete")
