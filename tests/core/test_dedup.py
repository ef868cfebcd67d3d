"""dedup_s: a completed job's id stays reserved that long, whatever the completed retention."""

from __future__ import annotations

import threading
import time

import pytest
import redis

import echomq
from echomq.lanes import Lanes, Outcome


def _complete_all(q: echomq.Queue) -> None:
    lanes = Lanes(q.redis, q.keys, q.settings)
    claimed = lanes.claim(10)
    assert claimed
    lanes.settle([Outcome(c.id, c.token, "c", "") for c in claimed])


def _until_gone(r: redis.Redis, key: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while r.exists(key):
        assert time.monotonic() < deadline, f"{key} never expired"
        threading.Event().wait(0.02)


def test_dedup_s_reserves_the_id_after_the_completed_hash_is_gone(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=0)
    assert q.add("x", 1, job_id="mail-7", dedup_s=0.5) == "mail-7"
    _complete_all(q)
    assert q.get("mail-7") is None  # retention dropped the completed hash at once
    assert q.add("x", 2, job_id="mail-7") == "mail-7"
    assert q.add_many([("x", 3, {"job_id": "mail-7", "delay": 5})]) == ["mail-7"]
    assert q.counts()["waiting"] == 0 and q.counts()["scheduled"] == 0
    assert 0 < r.pttl(q.keys.dedup("mail-7")) <= 500
    _until_gone(r, q.keys.dedup("mail-7"))
    q.add("x", 4, job_id="mail-7")
    assert q.get("mail-7").payload == 4  # type: ignore[union-attr]


def test_without_dedup_s_a_dropped_id_is_free_again(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=0)
    q.add("x", 1, job_id="once")
    _complete_all(q)
    q.add("x", 2, job_id="once")
    assert q.counts()["waiting"] == 1


def test_a_kept_job_id_stays_idempotent_without_dedup(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", 1, job_id="kept")
    _complete_all(q)
    q.add("x", 2, job_id="kept")
    assert q.counts()["waiting"] == 0
    assert q.get("kept").state == "completed"  # type: ignore[union-attr]


def test_dedup_s_counts_from_completion_not_from_admission(redis_url: str, queue_name: str,
                                                           r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=0)
    q.add("x", 1, job_id="late", dedup_s=3600)
    assert not r.exists(q.keys.dedup("late"))  # nothing reserved until it completes
    _complete_all(q)
    assert r.pttl(q.keys.dedup("late")) > 3500_000


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "10", True])
def test_bad_dedup_s_and_timeout_are_refused(redis_url: str, queue_name: str,
                                             bad: object) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError, match="dedup_s"):
        q.add("x", 1, dedup_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        q.add("x", 1, timeout=bad)  # type: ignore[arg-type]
    assert q.counts()["waiting"] == 0


def test_timeout_is_stored_as_timeout_ms(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    now = q.add("x", 1, timeout=2.5)
    later = q.add("x", 1, timeout=0.0004, delay=10)
    plain = q.add("x", 1)
    assert r.hget(q.keys.job(now), "timeout_ms") == b"2500"
    assert r.hget(q.keys.job(later), "timeout_ms") == b"1"
    assert r.hget(q.keys.job(plain), "timeout_ms") is None
