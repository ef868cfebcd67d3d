"""Delivery under faults, producer and consumer side: out-of-range due times, lone
surrogates, lease tokens across a data loss, passwords in URLs."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis

import echomq
from echomq.connection import redact_url
from echomq.floor.engine import redact_url as floor_redact_url
from echomq.keys import Keys
from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled


def _keys_of(r: redis.Redis, queue: str) -> list[bytes]:
    return sorted(r.scan_iter(match=f"{Keys(queue).prefix}*"))


@pytest.mark.parametrize("when", [{"delay": 1e15}, {"delay": 10**13},
                                  {"run_at": datetime(9999, 12, 31, tzinfo=UTC)}])
def test_out_of_range_due_time_is_refused_and_changes_nothing(
        redis_url: str, queue_name: str, r: redis.Redis, when: dict[str, object]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.InvalidSchedule, match="too far"):
        q.add("x", 1, **when)  # type: ignore[arg-type]
    with pytest.raises(echomq.InvalidSchedule, match="too far"):
        q.add_many([("ok", 1, {"delay": 5}), ("x", 1, when)])
    assert _keys_of(r, queue_name) == []


def test_schedule_script_refuses_a_due_time_it_cannot_store_exactly(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    from echomq import scripts

    k = Keys(queue_name)
    with pytest.raises(redis.exceptions.ResponseError, match="invalid due"):
        scripts.SCHEDULE(r, scripts.schedule_keys(k),
                         [k.prefix, 2, "a", "x", "1", "default", 3, 1, "", "", "", "", "0", "-5000",
                          "b", "x", "1", "default", 3, 1, "", "", "", "", "0", "-1e18"])
    assert _keys_of(r, queue_name) == []


def test_lone_surrogate_in_payload_raises_payload_error(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.PayloadError, match="UTF-8"):
        q.add("x", {"path": "/tmp/caf\udce9"})
    assert _keys_of(r, queue_name) == []


def test_payload_limit_counts_utf8_bytes(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_payload_bytes=10)
    q.add("x", "é" * 4)  # 10 bytes with the quotes
    with pytest.raises(echomq.PayloadError, match="11 bytes"):
        q.add("x", "€" * 3)  # 3 chars + quotes = 5 chars, 11 bytes


def test_lone_surrogate_in_error_or_result_settles_instead_of_killing_the_consumer(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_attempts=1)
    failing = q.add("fail", {})
    returning = q.add("ret", {})

    def handler(job: echomq.Job) -> object:
        if job.name == "fail":
            raise FileNotFoundError("no such file: /data/caf\udce9.txt")
        return {"path": "/data/caf\udce9.txt"}

    echomq.Consumer(q, handler).run(burst=True)
    dead = q.get(failing)
    done = q.get(returning)
    assert dead is not None and dead.state == "dead"
    assert "no such file: /data/caf" in (dead.error or "")
    assert done is not None and done.state == "completed"
    stored = q.redis.hget(q.keys.job(returning), "result")
    assert stored == b'{"path":"/data/caf\\udce9.txt"}'  # a JSON escape, valid UTF-8
    assert json.loads(stored) == {"path": "/data/caf\udce9.txt"}


def test_lease_tokens_do_not_repeat_across_a_valkey_data_loss(
        private_redis: LocalRedis) -> None:
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("tokens", redis=client)
    job_id = q.add("x", {}, job_id="same-job")
    lanes = Lanes(client, q.keys, q.settings)
    [before] = lanes.claim(1)
    private_redis.restart_empty()  # the job comes back (a floor would restore it); tokens too?
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("tokens", redis=client)
    assert q.add("x", {}, job_id=job_id) == job_id
    lanes = Lanes(client, q.keys, q.settings)
    [after] = lanes.claim(1)
    assert after.token != before.token
    # the stale holder from before the loss cannot settle the new claim
    assert lanes.settle([Outcome(job_id, before.token, "c")]) == [Settled.STALE]
    assert lanes.settle([Outcome(job_id, after.token, "c")]) == [Settled.COMPLETED]


def test_claim_tokens_are_integers_in_plain_digits(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(3)])
    claimed = Lanes(q.redis, q.keys, q.settings).claim(3)
    tokens = [int(c.token) for c in claimed]  # never "1.7e+15"
    assert [str(t) for t in tokens] == [c.token for c in claimed]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0?password=hunter2",
    "redis://user@127.0.0.1:6379/0?db=1&password=hunter2",
    "redis://:hunter2@127.0.0.1:6379/0?password=hunter2",
    "rediss://127.0.0.1:99999/0?password=hunter2",
    "redis://127.0.0.1:port/0?password=hunter2",
    "redis://:hunter2@127.0.0.1:port/0",
])
def test_redact_url_hides_query_password_and_survives_a_bad_port(url: str) -> None:
    for redact in (redact_url, floor_redact_url):
        shown = redact(url)
        assert "hunter2" not in shown
        assert shown.startswith(url.split("://")[0] + "://")


def test_connection_failed_message_hides_a_query_password(queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url="redis://127.0.0.1:1/0?password=hunter2")
    with pytest.raises(echomq.ConnectionFailed) as info:
        q.add("x", 1)
    assert "hunter2" not in str(info.value) and "password=***" in str(info.value)


def test_claims_of_a_thread_race_get_distinct_tokens(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(200)])
    got: list[str] = []
    lock = threading.Lock()

    def claim() -> None:
        lanes = Lanes(redis.Redis.from_url(redis_url), q.keys, q.settings)
        while batch := lanes.claim(7):
            with lock:
                got.extend(c.token for c in batch)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 200 and len(set(got)) == 200


def test_malformed_counters_in_a_job_hash_do_not_break_claim_settle_or_reap(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_attempts=1)
    ids = q.add_many([("x", i) for i in range(3)])
    for job_id in ids:  # as a hand-edited floor row or an older version could leave them
        q.redis.hset(q.keys.job(job_id), mapping={"attempts": "x", "max_attempts": "1.5e",
                                                  "stalls": "?", "max_stalls": ""})
    lanes = Lanes(q.redis, q.keys, q.settings)
    a, b, c = lanes.claim(3)
    assert a.attempts == 1
    assert lanes.settle([Outcome(a.id, a.token, "f", "boom")]) == [Settled.DEAD]
    assert lanes.release([(b.id, b.token)], "stall") == (1, 0)  # max_stalls read as 1
    assert lanes.settle([Outcome(c.id, c.token, "c")]) == [Settled.COMPLETED]


def test_lease_tokens_do_not_repeat_when_valkey_comes_back_from_an_older_snapshot(
        private_redis: LocalRedis) -> None:
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("rollback", redis=client)
    q.add_many([("x", i, {"job_id": f"j{i}"}) for i in range(3)])
    lanes = Lanes(client, q.keys, q.settings)
    lanes.settle([Outcome(c.id, c.token, "c") for c in lanes.claim(1)])
    client.save()  # the snapshot the server will come back from
    [held] = lanes.claim(1)  # a consumer holds this token when the server dies
    private_redis.kill()
    private_redis.start()
    client = redis.Redis.from_url(private_redis.url)
    lanes = Lanes(client, q.keys, q.settings)
    [again] = lanes.claim(1)
    assert again.id == held.id  # the snapshot had it waiting: claimed again
    assert again.token != held.token
    assert lanes.settle([Outcome(held.id, held.token, "c")]) == [Settled.STALE]
