"""A dedup_s that add() accepts never breaks the settle of the batch it completes in."""

from __future__ import annotations

import redis

import echomq
from echomq.errors import EchoMQError
from echomq.lanes import Lanes, Outcome


def test_a_dedup_s_beyond_the_servers_range_is_refused_or_settles_with_its_batch(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    try:
        first = q.add("x", 1, dedup_s=1e16)
    except (ValueError, EchoMQError):
        return  # refused with a clear error at add(): nothing admitted, nothing to break
    second = q.add("x", 2)
    lanes = Lanes(q.redis, q.keys, q.settings)
    claimed = lanes.claim(2)
    assert [c.id for c in claimed] == [first, second]
    lanes.settle([Outcome(c.id, c.token, "c", "") for c in claimed])
    assert {q.get(first).state, q.get(second).state} == {"completed"}  # type: ignore[union-attr]
    assert q.counts()["completed"] == 2
