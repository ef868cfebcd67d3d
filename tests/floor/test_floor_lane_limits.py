"""Lane limits on the floor, on both backends: the scheduler's copy of Valkey's limits, and
limits coming back after Valkey restarts empty (a lane that was one at a time must not run
its jobs side by side after a failover), also when Valkey loses its data again while the
limits and the jobs come back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq import scripts
from echomq.errors import StaleFence
from echomq.floor import Floor
from echomq.lanes import Lanes, Outcome


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    srv = LocalRedis().start()
    yield srv
    srv.stop()


def _tick(s: Scheduler) -> None:
    s.floor_retry_at = 0.0
    s.tick(time.monotonic())


def _scheduler(queue: str, client: redis.Redis, floor: Floor) -> Scheduler:
    return Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600)


def test_store_replaces_a_queues_lane_limits_under_the_fence(floor: Floor) -> None:
    assert floor.put_lane_limits("q", {"a": "1", "*": "3 - -"}, 5) == 2
    floor.put_lane_limits("other", {"a": "2"}, 5)
    assert floor.lane_limit_rows("q") == {"*": "3 - -", "a": "1"}
    # the copy: "a" and "*" were cleared, "b" is new; then one lane changed, then none
    assert floor.put_lane_limits("q", {"b": "- 10 1000"}, 6) == 3
    assert floor.lane_limit_rows("q") == {"b": "- 10 1000"}
    assert floor.put_lane_limits("q", {"b": "2", "c": "1"}, 6) == 2
    assert floor.put_lane_limits("q", {"b": "2", "c": "1"}, 6) == 0
    assert floor.put_lane_limits("q", {"b": "- 10 1000"}, 6) == 2
    assert floor.lane_limit_rows("q") == {"b": "- 10 1000"}
    with pytest.raises(StaleFence):
        floor.put_lane_limits("q", {}, 5)
    assert floor.lane_limit_rows("q") == {"b": "- 10 1000"}
    assert floor.lane_limit_rows("other") == {"a": "2"}


def test_the_scheduler_copies_every_change_of_the_lane_limits(floor: Floor, redis_url: str,
                                                               queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    q.set_lane_limit("a", max_active=1)
    q.set_lane_limit("*", max_active=3)
    sched = _scheduler(queue_name, client, floor)
    _tick(sched)  # a new queue: the first beat sets its epoch, the copy waits for it
    _tick(sched)
    assert floor.lane_limit_rows(queue_name) == {"*": "3", "a": "1"}
    q.set_lane_limit("a")  # cleared
    q.set_lane_limit("b", rate=10, per_s=1)
    _tick(sched)
    assert set(floor.lane_limit_rows(queue_name)) == {"*", "b"}
    assert floor.lane_limit_rows(queue_name)["b"] == client.hget(q.keys.limits, "b").decode()
    stored = floor.lane_limit_rows(queue_name)
    floor.put_lane_limits(queue_name, {}, sched.fence)  # the floor's copy is not re-read:
    _tick(sched)  # with nothing changed in Valkey, a beat writes nothing
    assert floor.lane_limit_rows(queue_name) == {}
    sched2 = _scheduler(queue_name, client, floor)  # a new leader copies them at once
    sched.close()
    _tick(sched2)
    assert floor.lane_limit_rows(queue_name) == stored


def test_lane_limits_survive_valkey_restarting_empty(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lq", redis=client)
    q.set_lane_limit("serial", max_active=1)
    q.set_lane_limit("partner", max_active=3, rate=10, per_s=1)
    sched = _scheduler("lq", client, floor)
    _tick(sched)
    _tick(sched)
    assert len(floor.lane_limit_rows("lq")) == 2
    before = q.lane_limits()

    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("lq", redis=client2)
    assert q2.lane_limits() == {}
    q2.set_lane_limit("partner", max_active=5)  # set again after the loss: the newer stays
    sched2 = _scheduler("lq", client2, floor)
    _tick(sched2)  # finds the epoch gone: the limits come back before any job does
    assert q2.lane_limits() == {**before, "partner": {"max_active": 5, "rate": None,
                                                      "per_s": None}}
    assert sched2.limits_restored == 1
    _tick(sched2)  # and the merged limits are the floor's copy again
    assert floor.lane_limit_rows("lq")["partner"] == "5"

    # the restored limit binds: one "serial" job at a time
    q2.add_many([("x", i, {"lane": "serial"}) for i in range(3)])
    lanes = Lanes(client2, q2.keys, q2.settings)
    [first] = lanes.claim(10)
    assert lanes.claim(10) == []
    lanes.settle([Outcome(first.id, first.token, "c")])
    assert len(lanes.claim(10)) == 1


def test_a_valkey_lost_after_the_lead_call_leaves_the_floors_limits_alone(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Valkey restarts empty between the scheduler's lead call (which saw its epoch) and
    its read of the limits: the empty hash must not reach the floor as "no limits"."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lq", redis=client)
    q.set_lane_limit("serial", max_active=1)
    sched = _scheduler("lq", client, floor)
    _tick(sched)
    _tick(sched)
    assert floor.lane_limit_rows("lq") == {"serial": "1"}
    q.set_lane_limit("other", max_active=2)  # a change: the next beat copies the limits

    lead = scripts.LEAD

    def lead_then_lose(*args: Any) -> Any:
        reply = lead(*args)
        client.flushall()  # Valkey's data is gone, the lead's reply still says the epoch
        q.set_lane_limit("newer", max_active=4)  # and a producer sets a limit at once
        return reply

    monkeypatch.setattr(scripts, "LEAD", lead_then_lose)
    _tick(sched)
    monkeypatch.setattr(scripts, "LEAD", lead)
    assert floor.lane_limit_rows("lq") == {"serial": "1"}  # not emptied
    _tick(sched)  # the loss is seen: the floor's limits come back beside the newer one
    assert {lane: v["max_active"] for lane, v in q.lane_limits().items()} == {
        "serial": 1, "newer": 4}


def _floored_jobs(q: echomq.Queue, sched: Scheduler, floor: Floor, n: int) -> list[str]:
    """``n`` deferred jobs of lane "serial", folded onto the floor."""
    ids = [q.add("x", {"i": i}, lane="serial", delay=3600) for i in range(n)]
    _tick(sched)
    assert floor.count("lq") == n
    return ids


def test_valkey_lost_again_after_the_limits_came_back_restarts_the_rehydration(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lq", redis=client)
    q.set_lane_limit("serial", max_active=1)
    sched = _scheduler("lq", client, floor)
    _tick(sched)
    ids = _floored_jobs(q, sched, floor, 3)
    assert floor.lane_limit_rows("lq") == {"serial": "1"}

    server.restart_empty()
    restore = scripts.LIMITS_RESTORE

    def restore_then_lose(*args: Any) -> Any:
        reply = restore(*args)
        client.flushall()  # lost again, between the limits and the jobs
        return reply

    monkeypatch.setattr(scripts, "LIMITS_RESTORE", restore_then_lose)
    _tick(sched)
    monkeypatch.setattr(scripts, "LIMITS_RESTORE", restore)
    _tick(sched)  # the mark was gone: the rehydration starts over, limits first
    _tick(sched)
    assert q.lane_limits()["serial"]["max_active"] == 1
    assert floor.lane_limit_rows("lq") == {"serial": "1"}
    assert sorted(j.id for j in q.jobs("scheduled", limit=10)) == sorted(ids)


def test_valkey_lost_in_the_middle_of_a_rehydration_loses_no_floor_row(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs restored before the loss are gone from Valkey again: the rehydration must
    not call itself complete (the orphan pass would then close their floor rows)."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lq", redis=client)
    sched = _scheduler("lq", client, floor)
    _tick(sched)
    ids = _floored_jobs(q, sched, floor, 3)

    server.restart_empty()
    restore = scripts.RESTORE

    def restore_then_lose(*args: Any) -> Any:
        reply = restore(*args)
        client.flushall()
        return reply

    monkeypatch.setattr(scripts, "RESTORE", restore_then_lose)
    _tick(sched)
    monkeypatch.setattr(scripts, "RESTORE", restore)
    for _ in range(3):
        sched.next_orphan_check = 0.0
        _tick(sched)
    assert floor.count("lq") == 3
    assert sorted(j.id for j in q.jobs("scheduled", limit=10)) == sorted(ids)


def test_thousands_of_lane_limits_come_back_in_short_calls(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lq", redis=client)
    sched = _scheduler("lq", client, floor)
    _tick(sched)
    for i in range(2500):  # a lane per tenant
        scripts.set_limit(client, q.keys, f"tenant-{i}", "1")
    _tick(sched)
    assert len(floor.lane_limit_rows("lq")) == 2500
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    restore, pairs = scripts.LIMITS_RESTORE, []

    def counted(client: Any, keys: Any, args: Any) -> Any:
        pairs.append((len(args) - 1) // 2)
        return restore(client, keys, args)

    monkeypatch.setattr(scripts, "LIMITS_RESTORE", counted)
    sched2 = _scheduler("lq", client2, floor)
    _tick(sched2)
    assert client2.hlen(q.keys.limits) == 2500 and sched2.limits_restored == 2500
    assert pairs == [1000, 1000, 500]


def test_a_floor_not_migrated_counts_as_down_with_the_hint_until_it_is(
        empty_floor: Floor, redis_url: str, queue_name: str) -> None:
    """A supervisor that started while its floor was unreachable never checked the schema:
    its scheduler does, so a migration not run shows as the floor being down, saying to run
    migrate, instead of failing on a missing table every beat."""
    empty_floor.upgrade("0002_crons")
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    sched = _scheduler(queue_name, client, empty_floor)
    _tick(sched)
    assert not sched.floor_ok and "migrate" in sched.floor_error
    assert "0002_crons" in sched.floor_error
    q.set_lane_limit("a", max_active=1)
    empty_floor.upgrade()
    _tick(sched)
    _tick(sched)
    assert sched.floor_ok
    assert empty_floor.lane_limit_rows(queue_name) == {"a": "1"}
