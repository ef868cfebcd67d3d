"""Queue-wide limits: across every lane, composed with the lanes' own limits."""

from __future__ import annotations

import math

import pytest
import redis

import echomq
from echomq.lanes import Lanes, Outcome
from echomq.wake import claim_doorbell


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def test_max_active_holds_across_lanes_and_a_settle_frees_a_slot(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(max_active=2)
    for lane in ("a", "b", "c"):
        for _ in range(2):
            q.add("x", {}, lane=lane)
    one, two = _lanes(q), _lanes(q)  # two consumers
    got = one.claim(5)
    assert len(got) == 2 and len({c.lane for c in got}) == 2
    assert two.claim(5) == []
    r.delete(q.keys.wake)
    assert one.settle([Outcome(got[0].id, got[0].token, "c")])
    assert r.llen(q.keys.wake) == 1  # the freed slot rang for parked consumers
    assert len(two.claim(5)) == 1
    assert q.queue_limit() == {"max_active": 2, "rate": None, "per_s": None}
    assert q.counts()["active"] == 2 and q.counts()["waiting"] == 3


def test_a_lane_limit_and_the_queue_limit_both_hold(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(max_active=3)
    q.set_lane_limit("a", max_active=1)
    for lane in ("a", "a", "b", "b", "b"):
        q.add("x", {}, lane=lane)
    got = _lanes(q).claim(10)
    assert sorted(c.lane for c in got) == ["a", "b", "b"]
    assert _lanes(q).claim(10) == []


def test_rate_limits_starts_across_the_queue(redis_url: str, queue_name: str,
                                             r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(rate=3, per_s=60)
    for lane in ("a", "b"):
        for _ in range(3):
            q.add("x", {}, lane=lane)
    lanes = _lanes(q)
    assert len(lanes.claim(2)) == 2
    assert len(lanes.claim(5)) == 1
    assert lanes.claim(5) == []
    assert r.zscore(q.keys.lanewake, "@queue") is not None  # promote opens the window
    assert q.lane_limits() == {}


def test_clearing_the_queue_limit_lets_claims_go_on(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(max_active=1)
    for _ in range(3):
        q.add("x", {})
    assert len(_lanes(q).claim(5)) == 1
    q.set_queue_limit()
    assert len(_lanes(q).claim(5)) == 2
    assert q.queue_limit()["max_active"] is None


@pytest.mark.parametrize("kwargs", [
    {"max_active": 0}, {"max_active": -1}, {"max_active": 1_000_000_000}, {"rate": 0},
    {"max_active": 1.5}, {"max_active": True}, {"rate": 5, "per_s": 0},
    {"rate": 5, "per_s": math.inf}, {"per_s": 1.0},
])
def test_bad_queue_limits_are_refused_and_nothing_changes(
        redis_url: str, queue_name: str, kwargs: dict[str, object]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(max_active=4)
    with pytest.raises(ValueError):
        q.set_queue_limit(**kwargs)  # type: ignore[arg-type]
    assert q.queue_limit() == {"max_active": 4, "rate": None, "per_s": None}


def test_a_job_dying_of_its_stalls_frees_a_queue_slot_and_rings(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """The queue is full and a consumer parked; the one running job's process dies past
    its stalls (reap.lua buries it): the slot it freed rings, or the waiting job waits for
    an unrelated event."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(max_active=1)
    first = q.add("x", {})
    r.hset(q.keys.job(first), "max_stalls", 0)
    second = q.add("x", {})
    one, two = _lanes(q), _lanes(q)
    [got] = one.claim(5)
    assert got.id == first
    assert two.claim(5) == []  # full: this consumer parks on the doorbell
    r.delete(q.keys.wake)
    assert one.release([(got.id, got.token)], "stall") == (0, 1)  # dead, not requeued
    assert q.get(first).state == "dead"  # type: ignore[union-attr]
    assert r.llen(q.keys.wake) == 1  # the freed slot rang for the parked consumer
    assert [c.id for c in two.claim(5)] == [second]


@pytest.mark.parametrize("doorbell", ["list", "marker"])
def test_a_full_queue_rate_window_rings_once_not_at_every_claim(
        redis_url: str, queue_name: str, r: redis.Redis, doorbell: str) -> None:
    """The claim that finds the queue's rate window full records when it opens and rings
    so a parked metronome looks again; the claims after it, with the window already
    recorded, ring nothing. A ring each would wake the consumer parked on the doorbell,
    whose claim rings again: a loop of empty claims until the window opens."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    claim_doorbell(r, q.keys, doorbell)  # what its consumers park on, in the meta
    q.set_queue_limit(rate=1, per_s=60)
    for _ in range(3):
        q.add("x", {})
    lanes = _lanes(q)
    assert len(lanes.claim(1)) == 1
    r.delete(q.keys.wake, q.keys.marker)
    assert lanes.claim(1) == []  # the window is full: recorded, and rung once
    assert r.zscore(q.keys.lanewake, "@queue") is not None
    rung = q.keys.marker if doorbell == "marker" else q.keys.wake
    assert r.exists(rung) == 1
    r.delete(q.keys.wake, q.keys.marker)
    assert lanes.claim(1) == []
    assert lanes.claim(1) == []
    assert r.exists(q.keys.wake) + r.exists(q.keys.marker) == 0


def test_a_later_schedule_head_does_not_push_back_a_rate_window_s_wake_on_the_marker(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """Marker doorbell: the full window's opening time is on the marker; a job scheduled
    for later (the new schedule head) leaves the earlier time there, or the parked
    metronome would sleep past the window's opening."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    claim_doorbell(r, q.keys, "marker")
    q.set_queue_limit(rate=1, per_s=60)
    for _ in range(2):
        q.add("x", {})
    lanes = _lanes(q)
    assert len(lanes.claim(1)) == 1
    r.delete(q.keys.marker)
    assert lanes.claim(1) == []
    opens = r.zscore(q.keys.lanewake, "@queue")
    assert opens is not None and r.zscore(q.keys.marker, "1") == opens
    q.add("y", {}, delay=120)  # the schedule's head, due after the window opens
    assert r.zscore(q.keys.marker, "1") == opens
