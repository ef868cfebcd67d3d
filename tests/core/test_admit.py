"""Admitting jobs: ids, idempotency, lanes, the doorbell, add_many."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis

import echomq
from echomq.keys import Keys
from echomq.wake import claim_doorbell


def test_add_returns_id_and_job_is_waiting(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("send", {"to": "a@b.c"}, lane="player-42")
    job = q.get(job_id)
    assert job is not None
    assert (job.id, job.name, job.payload, job.lane, job.state, job.attempts) == (
        job_id, "send", {"to": "a@b.c"}, "player-42", "waiting", 0)
    assert q.counts() == {"waiting": 1, "scheduled": 0, "active": 0, "completed": 0, "dead": 0,
                          "cancelled": 0, "blocked": 0}


def test_admit_is_idempotent_on_job_id(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    first = q.add("send", {"v": 1}, job_id="order-7")
    second = q.add("send", {"v": 2}, job_id="order-7")
    assert first == second == "order-7"
    assert q.get("order-7").payload == {"v": 1}  # type: ignore[union-attr]
    assert r.llen(Keys(queue_name).lane("default")) == 1
    assert q.counts()["waiting"] == 1
    # a delayed re-add of an existing id changes nothing either
    q.add("send", {"v": 3}, job_id="order-7", delay=10)
    assert q.counts() == {"waiting": 1, "scheduled": 0, "active": 0, "completed": 0, "dead": 0,
                          "cancelled": 0, "blocked": 0}


class CountingConnection(redis.Connection):
    """A real connection that counts the requests it writes (one per round trip)."""

    sent = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)  # type: ignore[arg-type]


def test_add_many_one_round_trip_and_mixed(redis_url: str, queue_name: str) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    q = echomq.Queue(queue_name, redis=redis.Redis(connection_pool=pool))
    # loads both admit scripts (a server that never ran one answers NOSCRIPT) and reads
    # the queue's durability dial
    q.add("warm", None)
    q.add("warm", None, delay=60)
    CountingConnection.sent = 0
    ids = q.add_many([("a", {"n": i}) for i in range(1200)]
                     + [("b", {"n": 1}, {"delay": 60, "lane": "x"}),
                        {"name": "c", "payload": [1, 2], "job_id": "fixed-c"}])
    assert CountingConnection.sent == 1, "add_many took more than one round trip"
    assert len(ids) == 1202 and len(set(ids)) == 1202
    assert ids[-1] == "fixed-c"
    assert q.counts()["waiting"] == 1202  # with the warm-up jobs
    assert q.counts()["scheduled"] == 2


def test_every_admit_rings_and_wake_is_capped(redis_url: str, queue_name: str,
                                             r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    wake = Keys(queue_name).wake
    q.add("x", 1)
    assert r.lrange(wake, 0, -1) == [b"1"]
    for i in range(200):
        q.add("x", i)
    assert r.llen(wake) == 64
    q.add_many([("x", i) for i in range(100)])
    assert r.llen(wake) == 64
    assert set(r.lrange(wake, 0, -1)) == {b"1"}  # the token is never a job


def test_delayed_admit_rings_only_for_a_new_head(redis_url: str, queue_name: str,
                                                r: redis.Redis, doorbell: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    claim_doorbell(r, q.keys, doorbell)
    bell = q.keys.wake if doorbell == "list" else q.keys.marker
    r.delete(bell)
    q.add("x", delay=60)
    assert r.exists(bell) == 1
    r.delete(bell)
    q.add("x", delay=120)  # later than the head: nobody needs to recompute a wait
    assert r.exists(bell) == 0
    head = q.add("x", delay=30)  # a new head
    assert r.exists(bell) == 1
    if doorbell == "marker":  # the marker carries the new head's due time
        assert r.zscore(bell, "1") == r.zscore(q.keys.schedule, head)


def test_run_at_uses_absolute_time(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    when = datetime.now(UTC) + timedelta(hours=2)
    job = q.get(q.add("x", run_at=when))
    assert job is not None and job.state == "scheduled"
    assert job.due_ms == int(when.timestamp() * 1000)


def test_zero_delay_is_immediate(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.get(q.add("x", delay=0)).state == "waiting"  # type: ignore[union-attr]
