"""Expiry: a job not started by its expiry never runs; it ends cancelled, "expired"."""

from __future__ import annotations

import asyncio
import math
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

import echomq
import echomq.aio
from echomq.expiry import expire_pass, expiring_key
from echomq.lanes import Lanes


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def _past(r: redis.Redis, q: echomq.Queue, jid: str) -> None:
    """Move a job's expiry into the past (as the server's clock passing it would)."""
    r.hset(q.keys.job(jid), "expires_ms", 1)
    r.zadd(expiring_key(q.keys), {jid: 1})


def test_a_job_met_at_claim_past_its_expiry_never_runs(redis_url: str, queue_name: str,
                                                       r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    late = q.add("x", {"n": 1}, expires=60)
    fresh = q.add("x", {"n": 2}, expires=60)
    assert float(r.hget(q.keys.job(late), "expires_ms") or 0) > 0
    _past(r, q, late)
    assert [c.id for c in _lanes(q).claim(5)] == [fresh]
    job = q.get(late)
    assert job is not None and job.state == "cancelled" and job.error == "expired"
    assert job.attempts == 0
    assert r.zscore(expiring_key(q.keys), late) is None
    assert q.counts()["cancelled"] == 1 and q.counts()["waiting"] == 0
    with pytest.raises(echomq.JobFailed, match="expired"):
        q.result(late, timeout=1)


def test_the_pass_cancels_waiting_and_scheduled_jobs_past_their_expiry(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    waiting = q.add("x", 1, lane="a", expires=30)
    scheduled = q.add("x", 2, delay=60, expires=datetime.now(UTC) + timedelta(hours=1))
    kept = q.add("x", 3, lane="a", expires=3600)
    _past(r, q, waiting)
    _past(r, q, scheduled)
    n, head = expire_pass(q.redis, q.keys)
    assert n == 2 and head is not None
    for jid in (waiting, scheduled):
        job = q.get(jid)
        assert job is not None and job.state == "cancelled" and job.error == "expired"
    assert r.lrange(q.keys.lane("a"), 0, -1) == [kept.encode()]
    assert r.zscore(q.keys.schedule, scheduled) is None
    assert q.counts() == {**q.counts(), "waiting": 1, "scheduled": 0, "cancelled": 2}


def test_an_expired_job_frees_its_lane_slot_at_claim(redis_url: str, queue_name: str,
                                                     r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("one", max_active=1)
    late = q.add("x", 1, lane="one", expires=60)
    after = q.add("x", 2, lane="one")
    _past(r, q, late)
    assert [c.id for c in _lanes(q).claim(1)] == [after]
    assert q.get(late).error == "expired"  # type: ignore[union-attr]


def test_a_job_started_before_its_expiry_is_not_touched(redis_url: str, queue_name: str,
                                                        r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1, expires=60)
    [c] = _lanes(q).claim(1)
    _past(r, q, jid)
    assert expire_pass(q.redis, q.keys)[0] == 0
    assert q.get(jid).state == "active"  # type: ignore[union-attr]


def test_a_standalone_consumer_never_runs_an_expired_job(redis_url: str, queue_name: str,
                                                         r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ran: list[str] = []
    late = q.add("x", 1, expires=60)
    _past(r, q, late)
    after = q.add("x", 2)
    consumer = echomq.Consumer(queue_name, lambda job: ran.append(job.id), redis_url=redis_url)
    t = threading.Thread(target=consumer.run, kwargs={"burst": True})
    t.start()
    t.join(20)
    assert ran == [after]


@pytest.mark.parametrize("bad", [-1, 0, math.nan, math.inf, "5", True,
                                 datetime(2030, 1, 1)])
def test_a_bad_expiry_is_refused_and_nothing_is_admitted(redis_url: str, queue_name: str,
                                                         bad: object) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError, match="expires"):
        q.add("x", 1, expires=bad)  # type: ignore[arg-type]
    assert sum(q.counts().values()) == 0


def test_add_many_takes_an_expiry_per_job(redis_url: str, queue_name: str,
                                          r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    soon, kept, later = q.add_many([
        ("x", {"n": 1}, {"expires": 60}),
        ("x", {"n": 2}),
        ("x", {"n": 3}, {"expires": datetime.now(UTC) + timedelta(hours=1), "delay": 30}),
    ])
    marked = {x.decode() for x in r.zrange(expiring_key(q.keys), 0, -1)}
    assert marked == {soon, later}
    assert r.hget(q.keys.job(kept), "expires_ms") is None
    _past(r, q, soon)
    assert [c.id for c in _lanes(q).claim(5)] == [kept]  # met past its expiry: cancelled
    job = q.get(soon)
    assert job is not None and job.state == "cancelled" and job.error == "expired"


def test_add_many_expiries_are_marked_in_the_admit_s_transaction(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    monitor = redis.Redis.from_url(redis_url).monitor()
    seen: list[str] = []
    with monitor as m:
        q.add_many([("x", {}, {"expires": 60}), ("x", {})])
        for command in m.listen():
            text = command["command"]
            if text.startswith(("MULTI", "EXEC", "EVALSHA")):
                seen.append(text.split()[0])
            if text.startswith("EXEC"):
                break
    assert seen[0] == "MULTI" and seen[-1] == "EXEC" and seen.count("EVALSHA") == 2


@pytest.mark.parametrize("bad", [
    {"tx": object(), "jobs": [("x", {}, {"expires": 60})], "says": "tx= and expires="},
    {"jobs": [("x", {}, {"expires": 60}), {"name": "y", "after": ["nope"]}],
     "says": "after= and expires="},
    {"jobs": [("x", {}, {"expires": -1})], "says": "expires must be"},
])
def test_add_many_refuses_an_expiry_with_tx_or_dependencies_and_admits_nothing(
        redis_url: str, queue_name: str, bad: dict[str, Any]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError, match=bad["says"]):
        q.add_many(bad["jobs"], tx=bad.get("tx"))
    assert sum(q.counts().values()) == 0


def test_aio_add_many_takes_an_expiry_per_job(redis_url: str, queue_name: str,
                                              r: redis.Redis) -> None:
    async def main() -> list[str]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            return await aq.add_many([("x", {}, {"expires": 60}), ("x", {})])
        finally:
            await aq.close()

    soon, kept = asyncio.run(main())
    assert {x.decode() for x in r.zrange(expiring_key(echomq.Queue(queue_name).keys), 0, -1)
            } == {soon}
    assert r.hget(echomq.Queue(queue_name).keys.job(kept), "expires_ms") is None


def test_a_multi_queue_add_many_refuses_an_expiry(redis_url: str, queue_name: str) -> None:
    with pytest.raises(ValueError, match="expires option is taken by Queue.add_many"):
        echomq.add_many({queue_name: [("x", {}, {"expires": 60})]}, redis_url=redis_url)
    assert sum(echomq.Queue(queue_name, redis_url=redis_url).counts().values()) == 0


def test_an_expiry_never_lands_on_another_job_under_the_same_id(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # the admit leaves an existing id alone, and so does its mark: that job is not this add's
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("pay", {"n": 1}, job_id="x1")
    q.add_many([("pay", {"n": 2}, {"job_id": "x1", "expires": 0.05}),
                ("pay", {"n": 3}, {"job_id": "y1"}),
                ("pay", {"n": 4}, {"job_id": "y1", "expires": 0.05})])
    q.add("pay", {"n": 5}, job_id="x1", expires=0.05)

    async def aio_adds() -> None:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            await aq.add("pay", {"n": 6}, job_id="x1", expires=0.05)
            await aq.add_many([("pay", {"n": 7}, {"job_id": "y1", "expires": 0.05})])
        finally:
            await aq.close()

    asyncio.run(aio_adds())
    for jid in ("x1", "y1"):
        assert r.hget(q.keys.job(jid), "expires_ms") is None, jid
        assert r.zscore(expiring_key(q.keys), jid) is None, jid
    # the same add sent again (its payload, as stored) is its own: marked as the first was
    mine = q.add("pay", {"n": 8}, job_id="z1", expires=60)
    at = r.zscore(expiring_key(q.keys), mine)
    assert q.add("pay", {"n": 8}, job_id="z1", expires=60) == mine
    assert r.zscore(expiring_key(q.keys), mine) == at


def test_add_many_with_expiries_holds_the_server_one_batch_at_a_time(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jobs = [("x", {"i": i}, {"expires": 60}) for i in range(1200)]
    with redis.Redis.from_url(redis_url).monitor() as m:
        q.add_many(jobs)
        execs = 0
        for command in m.listen():
            text = command["command"]
            if text.startswith("EXEC"):
                execs += 1
                if execs == 3:
                    break
    assert execs == 3  # 500 + 500 + 200 jobs, each batch with its marks
    assert r.zcard(expiring_key(q.keys)) == 1200
