"""A master dies (SIGKILL), its replica takes over, and nothing acknowledged is lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from echomq.supervisor.drills.localcluster import LocalCluster
from redis.cluster import RedisCluster

import echomq
from echomq.connection import connect

from .conftest import Supervisor, spread_queues, start_cluster, wait_until

JOBS = 300
KILL_AFTER = 80


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own: the test kills one of its masters."""
    c = start_cluster()
    try:
        yield c
    finally:
        c.stop()


class Producer(threading.Thread):
    """Admits JOBS jobs with durability "sync" round-robin over the queues; a job counts as
    acknowledged once add() returned. A refused add is retried with the same job id."""

    def __init__(self, url: str, names: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = connect(url)
        self.queues = [echomq.Queue(n, redis=self.client, durability="sync") for n in names]
        self.acked: list[tuple[str, str]] = []
        self.refused = 0

    def run(self) -> None:
        for i in range(JOBS):
            q = self.queues[i % len(self.queues)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    q.add("f", {"i": i}, job_id=f"f{i}")
                    self.acked.append((q.name, f"f{i}"))
                    break
                except (echomq.ConnectionFailed, echomq.NotReplicated,
                        redis.exceptions.RedisError):
                    self.refused += 1
                    time.sleep(0.05)  # the cluster is electing a new master


def test_failover_keeps_jobs_flowing_and_loses_no_synced_job(
        own_cluster: LocalCluster, r: redis.Redis,
        supervisor: Callable[..., Supervisor]) -> None:
    rc = connect(own_cluster.url)
    assert isinstance(rc, RedisCluster)
    names = spread_queues(rc, 9)
    victim = own_cluster.master_of(f"emq:{{{names[0]}}}:wake")
    solo = next(n for n in names[1:] if own_cluster.master_of(f"emq:{{{n}}}:wake") is victim)
    names.remove(solo)
    heir = own_cluster.replica_of(victim)
    url = next(n for n in own_cluster.nodes if n is not victim).url
    sup = supervisor(url, names, "--beat-ms", "200", "--lease-ms", "3000")
    sup.wait_for_log(r"consumer \d+ started", len(names))
    ran: list[str] = []  # a library Consumer parked on the victim, beside the supervisor
    consumer = echomq.Consumer(solo, lambda job: ran.append(job.id), redis_url=url,
                               beat_ms=200, lease_ms=3000)
    threading.Thread(target=consumer.run, daemon=True).start()
    solo_q = echomq.Queue(solo, redis=rc, durability="sync")
    before = [solo_q.add("s", {}) for _ in range(5)]
    wait_until(lambda: set(before) <= set(ran), 30, "the consumer to run jobs before the kill")
    producer = Producer(url, names)
    producer.start()
    wait_until(lambda: len(producer.acked) >= KILL_AFTER, 60, "admits before the kill")
    victim.kill()  # SIGKILL: the master is gone with whatever it had not replicated
    own_cluster.wait_ok(30)
    assert own_cluster.master_of(f"emq:{{{names[0]}}}:wake") is heir
    producer.join(120)
    assert not producer.is_alive()
    assert len(producer.acked) == JOBS

    def done() -> set[tuple[str, str]]:
        return {(n, x.decode()) for n in names for x in r.lrange(f"ledger:{n}:done", 0, -1)}

    try:
        wait_until(lambda: set(producer.acked) <= done(), 90,
                   "every acknowledged job to run after the failover")
    except AssertionError:
        lost = sorted(set(producer.acked) - done())
        counts = {n: echomq.Queue(n, redis=rc).counts() for n in names}
        raise AssertionError(f"lost {len(lost)}: {lost[:10]}\n{counts}\n{sup.log[-6000:]}"
                             ) from None
    assert sup.proc.poll() is None  # the supervisor rode through it
    after = [solo_q.add("s", {}) for _ in range(5)]  # the parked consumer found the heir
    wait_until(lambda: set(after) <= set(ran), 30, "the consumer to run jobs after the kill")
    consumer.stop()
    assert sup.stop() == 0
