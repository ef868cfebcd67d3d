"""The supervisor's pass cancels an expired job nobody claims."""

from __future__ import annotations

from collections.abc import Callable

import echomq

from .conftest import Supervisor, wait_until


def test_the_supervisor_pass_cancels_an_expired_job_nobody_claims(
        supervisor: Callable[..., Supervisor], redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.pause()  # nothing is claimed: only the pass can meet it
    jid = q.add("x", 1, lane="a", expires=0.3)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--beat-ms", "100")
    wait_until(lambda: q.get(jid).state == "cancelled", 15,  # type: ignore[union-attr]
               "the pass to cancel the job")
    assert q.get(jid).error == "expired"  # type: ignore[union-attr]
    assert q.redis.llen(q.keys.lane("a")) == 0 and q.counts()["waiting"] == 0
    sup.wait_for_log(r"queue \S+: 1 job\(s\) expired before they started")
