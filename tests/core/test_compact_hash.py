"""A job hash stores no field that holds what its absence reads as (attempts 0, stalls 0,
no backoff of its own): ~32 bytes a job, every reader taking the absent field as 0 or
the consumer's default."""

from __future__ import annotations

import redis

import echomq
from echomq.config import QueueSettings
from echomq.lanes import Lanes, Outcome

DEFAULTED = (b"attempts", b"stalls", b"backoff")


def test_every_way_in_writes_no_defaulted_field(redis_url: str, queue_name: str,
                                                r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    waiting = q.add("x", {})
    scheduled = q.add("x", {}, delay=60)
    blocked = q.add("x", {}, after=[waiting])
    debounced = q.add("x", {}, debounce="k", debounce_s=60)
    for jid in (waiting, scheduled, blocked, debounced):
        fields = r.hgetall(q.keys.job(jid))
        assert fields and not set(fields) & set(DEFAULTED), (jid, fields)
        job = q.get(jid)
        assert job is not None and job.attempts == 0 and job.stalls == 0
    q.close()


def test_a_job_without_the_fields_runs_retries_and_counts_its_attempts(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_attempts=2)
    jid = q.add("x", {})
    lanes = Lanes(r, q.keys, QueueSettings())
    [c] = lanes.claim(1)
    assert c.attempts == 1 and c.backoff == ""
    lanes.settle([Outcome(c.id, c.token, "f", "boom", 0)])
    assert q.get(jid).state == "scheduled"  # type: ignore[union-attr]
    q.close()


def test_a_backoff_of_its_own_is_stored(redis_url: str, queue_name: str,
                                        r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", {}, backoff=2.5)
    assert r.hget(q.keys.job(jid), "backoff") not in (None, b"")
    q.close()
