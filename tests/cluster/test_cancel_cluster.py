"""Cancel of a running job on a Valkey Cluster: the supervisor hears it on the stop channel."""

from __future__ import annotations

from collections.abc import Callable

from echomq.supervisor.drills.localcluster import LocalCluster
from redis.cluster import RedisCluster

import echomq

from .conftest import Supervisor, spread_queues, wait_until


def test_a_running_sync_job_is_cancelled_on_a_cluster(
        cluster: LocalCluster, rc: RedisCluster,
        supervisor: Callable[..., Supervisor]) -> None:
    [name] = spread_queues(rc, 1)
    sup = supervisor(cluster.url, [name], "--beat-ms", "200")
    sup.wait_for_log(r"consumer \d+ started")
    q = echomq.Queue(name, redis=rc)
    jid = q.add("x", {"sleep": 120})
    wait_until(lambda: q.get(jid).state == "active", 30,  # type: ignore[union-attr]
               "the job to start")
    assert q.cancel(jid) is True
    sup.wait_for_log(rf"job {jid} cancelled while consumer \d+ ran it; ending the process")
    sup.wait_for_log(r"consumer \d+ started", count=2)
    assert q.get(jid).error == "cancelled while running"  # type: ignore[union-attr]
    after = q.add("x", {})
    wait_until(lambda: q.get(after).state == "completed", 30,  # type: ignore[union-attr]
               "the respawned consumer to run a job")
