"""The queue-wide limit on the floor, on both backends: copied like the lane limits, and
back (binding) after Valkey restarts empty."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor
from echomq.lanes import Lanes


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    srv = LocalRedis().start()
    yield srv
    srv.stop()


def _tick(s: Scheduler) -> None:
    s.floor_retry_at = 0.0
    s.tick(time.monotonic())


def test_the_queue_limit_survives_valkey_restarting_empty(floor: Floor,
                                                          server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("ql", redis=client)
    q.set_queue_limit(max_active=2, rate=50, per_s=2)
    q.set_lane_limit("serial", max_active=1)
    sched = Scheduler("ql", client, floor, beat_ms=100, horizon_s=3600)
    _tick(sched)
    _tick(sched)
    assert floor.lane_limit_rows("ql")["@queue"] == "2 50 2000"

    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("ql", redis=client2)
    assert q2.queue_limit()["max_active"] is None
    sched2 = Scheduler("ql", client2, floor, beat_ms=100, horizon_s=3600)
    _tick(sched2)
    assert q2.queue_limit() == {"max_active": 2, "rate": 50, "per_s": 2.0}
    assert q2.lane_limits() == {"serial": {"max_active": 1, "rate": None, "per_s": None}}
    q2.add_many([("x", i, {"lane": f"l{i}"}) for i in range(4)])
    assert len(Lanes(client2, q2.keys, q2.settings).claim(10)) == 2  # it binds again
