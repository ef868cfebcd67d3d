"""A debounced job under the floor: the payloads gathered after its row was written reach
the floor too, so a Valkey that restarts empty loses none of them."""

from __future__ import annotations

import redis
from beats import tick as _tick
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor


def _scheduler(client: redis.Redis, floor: Floor, queue: str) -> Scheduler:
    s = Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600)  # type: ignore[arg-type]
    client.hset(f"emq:{{{queue}}}:meta", "fold", "1")
    return s


def test_payloads_gathered_after_the_fold_survive_valkey_restarting_empty(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("gather", redis=client)
    sched = _scheduler(client, floor, "gather")
    _tick(sched)  # takes the lead and sets the epoch
    jid = q.add("sync", {"n": 1}, debounce="k", debounce_s=600)
    _tick(sched)  # folds the job: its row is on the floor
    assert floor.count("gather") == 1
    assert q.add("sync", {"n": 2}, debounce="k", debounce_s=600) == jid  # gathered
    _tick(sched)
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("gather", redis=client2)
    sched2 = _scheduler(client2, floor, "gather")
    _tick(sched2)
    job = q2.get(jid)
    assert job is not None and job.state == "scheduled"
    assert job.payloads == [{"n": 1}, {"n": 2}]
