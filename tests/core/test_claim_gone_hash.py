"""A claim that pops an id whose job hash is gone drops it; on a lane with a max_active it
gives the lane's count back, or the lane stays at its limit with nothing running."""

from __future__ import annotations

import redis

import echomq
from echomq.lanes import Lanes


def test_a_dropped_id_on_a_limited_lane_gives_its_count_back(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", max_active=1)
    gone = q.add("x", {}, lane="a")
    r.delete(q.keys.job(gone))  # its hash went (trimmed, deleted by hand): the id stays
    lanes = Lanes(q.redis, q.keys, q.settings)
    assert lanes.claim(1) == []  # the id is dropped, nothing is claimed
    assert r.hget(q.keys.active, "a") is None, "the dropped id kept a slot of the lane"
    assert r.smembers(q.keys.blocked) == set()
    later = q.add("x", {}, lane="a")
    [claimed] = lanes.claim(1)  # the lane's one slot is free: its next job runs
    assert claimed.id == later and r.hget(q.keys.active, "a") == b"1"


def test_a_dropped_id_ahead_of_a_waiting_job_does_not_block_it_in_the_same_claim(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", max_active=1)
    gone, waiting = q.add("x", {}, lane="a"), q.add("x", {}, lane="a")
    r.delete(q.keys.job(gone))
    [claimed] = Lanes(q.redis, q.keys, q.settings).claim(2)
    assert claimed.id == waiting and r.hget(q.keys.active, "a") == b"1"
    assert r.smembers(q.keys.blocked) == set()
