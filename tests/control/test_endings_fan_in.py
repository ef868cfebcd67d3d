"""A job that ends by cancel-while-running or by expiry is an ending like any other: the
jobs that wait for it (after=) are told (dead, or released for on_dep_failure="run"),
and the event stream records it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import echomq
from echomq.expiry import expire_pass, expiring_key
from echomq.lanes import Lanes


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[echomq.Queue]:
    queue = echomq.Queue(queue_name, redis_url=redis_url)
    yield queue
    queue.close()


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def _past(r: redis.Redis, q: echomq.Queue, jid: str) -> None:
    """Move a job's expiry into the past (as the server's clock passing it would)."""
    r.hset(q.keys.job(jid), "expires_ms", 1)
    r.zadd(expiring_key(q.keys), {jid: 1})


def _kinds(q: echomq.Queue, jid: str) -> list[str]:
    return [ev.kind for ev in q.events(block_s=0) if ev.job_id == jid]


def test_cancel_of_a_running_job_ends_its_dependents(q: echomq.Queue) -> None:
    a = q.add("a")
    b = q.add("b", after=[a])
    c = q.add("c", after=[b])
    runs = q.add("runs", after=[a], on_dep_failure="run")
    [job] = _lanes(q).claim(1)
    assert job.id == a
    assert q.cancel(a) is True
    assert (q.get(b).state, q.get(b).error) == ("dead", f"dependency {a} cancelled")
    assert (q.get(c).state, q.get(c).error) == ("dead", f"dependency {b} dead")
    assert q.get(runs).state == "waiting"
    assert q.counts()["blocked"] == 0
    assert "cancelled" in _kinds(q, a)


def test_an_expired_job_met_at_claim_ends_its_dependents(q: echomq.Queue,
                                                          r: redis.Redis) -> None:
    a = q.add("a", expires=60)
    b = q.add("b", after=[a])
    _past(r, q, a)
    assert _lanes(q).claim(5) == []
    assert q.get(a).state == "cancelled"
    assert (q.get(b).state, q.get(b).error) == ("dead", f"dependency {a} cancelled")
    assert q.counts()["blocked"] == 0
    assert "cancelled" in _kinds(q, a)


def test_an_expired_job_met_by_the_pass_ends_its_dependents(q: echomq.Queue,
                                                             r: redis.Redis) -> None:
    a = q.add("a", expires=60)
    b = q.add("b", after=[a])
    runs = q.add("runs", after=[a], on_dep_failure="run")
    _past(r, q, a)
    assert expire_pass(q.redis, q.keys)[0] == 1
    assert q.get(a).state == "cancelled"
    assert (q.get(b).state, q.get(b).error) == ("dead", f"dependency {a} cancelled")
    assert q.get(runs).state == "waiting"
    assert "cancelled" in _kinds(q, a)
