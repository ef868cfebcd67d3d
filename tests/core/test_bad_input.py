"""Bad input: a clear error and nothing changed in the queue."""

from __future__ import annotations

from datetime import datetime

import pytest
import redis

import echomq
from echomq.keys import Keys


def _keys_of(r: redis.Redis, queue: str) -> list[bytes]:
    return sorted(r.scan_iter(match=f"{Keys(queue).prefix}*"))


@pytest.mark.parametrize("name", ["", "a{b}", "has space", "x" * 129, "é", None, 7])
def test_invalid_queue_names(redis_url: str, name: object) -> None:
    with pytest.raises(echomq.InvalidName, match="invalid queue name"):
        echomq.Queue(name, redis_url=redis_url)  # type: ignore[arg-type]


@pytest.mark.parametrize("lane", ["", "{x}", "a/b", "y" * 129])
def test_invalid_lane_names(redis_url: str, queue_name: str, r: redis.Redis, lane: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.InvalidName, match="invalid lane name"):
        q.add("x", 1, lane=lane)
    assert _keys_of(r, queue_name) == []


@pytest.mark.parametrize("payload", [object(), {1, 2}, float("nan"), b"bytes"])
def test_non_json_payloads(redis_url: str, queue_name: str, r: redis.Redis,
                           payload: object) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.PayloadError, match="JSON"):
        q.add("x", payload)
    assert _keys_of(r, queue_name) == []


def test_oversized_payload_and_configurable_limit(redis_url: str, queue_name: str,
                                                 r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.PayloadError, match="over the limit of 524288"):
        q.add("x", "a" * (512 * 1024))
    small = echomq.Queue(queue_name, redis_url=redis_url, max_payload_bytes=100)
    with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
        small.add("x", "a" * 100)
    assert _keys_of(r, queue_name) == []
    small.add("x", "a" * 90)


def test_payload_limit_counts_utf8_bytes_not_characters(redis_url: str, queue_name: str,
                                                        r: redis.Redis) -> None:
    small = echomq.Queue(queue_name, redis_url=redis_url, max_payload_bytes=100)
    with pytest.raises(echomq.PayloadError, match="payload is 122 bytes"):
        small.add("x", "\u00e9" * 60)  # 62 characters, 122 bytes of UTF-8
    assert _keys_of(r, queue_name) == []
    job = small.get(small.add("x", "\u00e9" * 49))  # 100 bytes: exactly the limit
    assert job is not None and job.payload == "\u00e9" * 49


def test_bad_schedules(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.InvalidSchedule, match="naive"):
        q.add("x", run_at=datetime(2030, 1, 1))
    with pytest.raises(echomq.InvalidSchedule, match=">= 0"):
        q.add("x", delay=-1)
    with pytest.raises(echomq.InvalidSchedule):
        q.add("x", delay=float("inf"))
    with pytest.raises(echomq.InvalidSchedule, match="not both"):
        q.add("x", delay=1, run_at=datetime.now().astimezone())
    assert _keys_of(r, queue_name) == []


def test_bad_batch_admits_nothing(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.PayloadError):
        q.add_many([("x", 1), ("x", 2), ("x", object())])
    assert _keys_of(r, queue_name) == []


def test_bad_job_ids_and_attempts(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.InvalidName):
        q.add("x", job_id="a b")
    with pytest.raises(ValueError, match="max_attempts"):
        q.add("x", max_attempts=0)
    with pytest.raises(echomq.ConfigError):
        q.add("x", backoff=-1)
    with pytest.raises(echomq.ConfigError, match="unknown queue setting"):
        echomq.Queue(queue_name, redis_url=redis_url, no_such_setting=1)


def test_unreachable_server_redacts_password() -> None:
    q = echomq.Queue("q", redis_url="redis://user:hunter2@127.0.0.1:1/0")
    with pytest.raises(echomq.ConnectionFailed) as info:
        q.add("x", 1)
    assert "hunter2" not in str(info.value)
    assert "***" in str(info.value) and "127.0.0.1:1" in str(info.value)
    with pytest.raises(echomq.ConnectionFailed):
        q.counts()


def test_corrupt_job_hash_is_reported_not_lost(redis_url: str, queue_name: str,
                                               r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    keys = Keys(queue_name)
    r.hset(keys.job("broken"), mapping={"payload": "{not json"})
    with pytest.raises(echomq.CorruptJob, match="lacks"):
        q.get("broken")
    # a job whose payload was corrupted in place goes dead with the reason, once
    job_id = q.add("x", {"ok": 1})
    r.hset(keys.job(job_id), "payload", "{not json")
    ran: list[str] = []
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == []
    with pytest.raises(echomq.CorruptJob, match="not JSON"):
        q.get(job_id)
    dead = q.dead()
    assert [d.id for d in dead] == [job_id] and "not JSON" in (dead[0].error or "")
    assert dead[0].payload == "{not json" and dead[0].state == "dead"
