"""The dashboard's throughput history: rates from two samples of a queue's running totals."""

from __future__ import annotations

import redis

import echomq
from echomq.lanes import Lanes, Outcome
from echomq.ops.dashboard import Dashboard


def test_rates_come_from_the_totals_between_samples(redis_url: str, queue_name: str,
                                                   r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(6)])
    history = Dashboard(r).history
    history.sample()
    assert history.rates(queue_name) == []
    lanes = Lanes(q.redis, q.keys, q.settings)
    claimed = lanes.claim(6)
    lanes.settle([Outcome(c.id, c.token, "c" if i < 4 else "d", "x")
                  for i, c in enumerate(claimed)])
    history.sample()
    [(_, done, failed)] = history.rates(queue_name)
    span_min = (history.samples[queue_name][1][0] - history.samples[queue_name][0][0]) / 60
    assert round(done * span_min) == 4 and round(failed * span_min) == 2
