"""Debounce that keeps every payload: adds with one key gather into one job."""

from __future__ import annotations

import math
import threading

import pytest
import redis

import echomq
from echomq.debouncing import DebounceClash
from echomq.lanes import Lanes


def _due(r: redis.Redis, q: echomq.Queue, jid: str) -> float:
    return float(r.zscore(q.keys.schedule, jid) or 0)


def _now_ms(r: redis.Redis) -> float:
    sec, us = r.time()
    return sec * 1000 + us / 1000


def test_adds_with_one_key_gather_into_one_job_due_after_the_last(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = [q.add("sync", {"n": i}, debounce="user-7", debounce_s=30, debounce_max_s=600)
           for i in range(5)]
    assert len(set(ids)) == 1
    jid = ids[0]
    job = q.get(jid)
    assert job is not None and job.state == "scheduled"
    assert job.payload == {"n": 4} and job.payloads == [{"n": i} for i in range(5)]
    before = _now_ms(r)
    q.add("sync", {"n": 5}, debounce="user-7", debounce_s=30, debounce_max_s=600)
    assert before + 29_000 <= _due(r, q, jid) <= _now_ms(r) + 30_000  # 30 s after the last
    assert q.counts()["scheduled"] == 1
    other = q.add("sync", {"n": 0}, debounce="user-8", debounce_s=30)
    assert other != jid


def test_the_due_time_never_passes_the_max_after_the_first(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    first = _now_ms(r)
    jid = q.add("s", 1, debounce="k", debounce_s=50, debounce_max_s=60)
    r.hset(q.keys.job(jid), "debounce_first_ms", int(first) - 30_000)  # first add 30 s ago
    q.add("s", 2, debounce="k", debounce_s=50, debounce_max_s=60)
    assert _due(r, q, jid) <= first + 30_000 + 1


def test_the_handler_sees_every_payload_and_an_add_after_the_start_opens_a_new_job(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("s", "a", debounce="k", debounce_s=0.05)
    q.add("s", "b", debounce="k", debounce_s=0.05)
    seen: list[tuple[str, object, list[object]]] = []
    opened: list[str] = []

    def handler(job: echomq.Job) -> None:
        seen.append((job.id, job.payload, job.payloads))
        if not opened:
            opened.append(q.add("s", "c", debounce="k", debounce_s=0.05))

    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url, beat_ms=50)
    t = threading.Thread(target=consumer.run, daemon=True)
    t.start()
    try:
        q.result(jid, timeout=10)
        assert opened and opened[0] != jid
        q.result(opened[0], timeout=10)
    finally:
        consumer.stop()
        t.join(10)
    assert seen == [(jid, "b", ["a", "b"]), (opened[0], "c", ["c"])]


def test_a_plain_job_has_its_payload_as_its_payloads(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("s", {"x": 1})
    [c] = Lanes(q.redis, q.keys, q.settings).claim(1)
    assert c.to_job(queue_name).payloads == [{"x": 1}]
    assert q.get(jid).payloads == [{"x": 1}]  # type: ignore[union-attr]


def test_a_job_id_that_clashes_is_refused_and_nothing_changes(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    taken = q.add("s", 1)
    with pytest.raises(DebounceClash, match="clashes"):
        q.add("s", 2, debounce="k", debounce_s=5, job_id=taken)
    assert r.get(q.keys.prefix + "debounce:k") is None
    jid = q.add("s", 3, debounce="k", debounce_s=5, job_id="mine")
    assert jid == "mine"
    with pytest.raises(DebounceClash):
        q.add("s", 4, debounce="k", debounce_s=5, job_id="other")
    assert q.get("mine").payloads == [3]  # type: ignore[union-attr]
    assert q.get("other") is None


@pytest.mark.parametrize("options", [
    {"debounce_s": -1}, {"debounce_s": 0}, {"debounce_s": math.nan}, {"debounce_s": math.inf},
    {"debounce_s": None}, {"debounce_s": 5, "debounce_max_s": 1},
    {"debounce_s": 5, "debounce_max_s": math.inf}, {"debounce_s": 5, "delay": 3},
    {"debounce_s": 5, "expires": 3}, {"debounce_s": True},
])
def test_bad_debounce_values_are_refused_and_nothing_is_admitted(
        redis_url: str, queue_name: str, options: dict[str, object]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError):
        q.add("s", 1, debounce="k", **options)  # type: ignore[arg-type]
    assert sum(q.counts().values()) == 0


@pytest.mark.parametrize("key", ["", "a b", 7, "x" * 129])
def test_a_bad_debounce_key_is_refused(redis_url: str, queue_name: str, key: object) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError, match="debounce"):
        q.add("s", 1, debounce=key, debounce_s=1)  # type: ignore[arg-type]
    assert sum(q.counts().values()) == 0
