"""A settle, claim or release the server refused: the concurrent drain keeps what it held
and sends it again, on a quiet queue too, and a failed call loses no reply of another
call of the same round trip."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis

import echomq
from echomq.keys import Keys


def _wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _glob(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\^" else c for c in text)


def _all_keys_but(key: str) -> list[str]:
    """ACL key patterns that allow every key except ``key`` (and the keys it begins)."""
    pats = [f"~{_glob(key[:i])}[^{_glob(c)}]*" for i, c in enumerate(key)]
    return [*pats, f"~{_glob(key)}?*"]


@pytest.mark.timeout(60)
def test_a_refused_settle_is_sent_again_on_a_quiet_queue(
        private_redis: LocalRedis) -> None:
    queue = "refused"
    admin = redis.Redis.from_url(private_redis.url)
    # a consumer whose user may not touch the completed set: its settle is refused (NOPERM,
    # taken as an outage) while everything else it does goes through, so nothing else pokes
    # the drain: the queue is quiet
    narrow = ["narrow", "on", ">pw", "+@all", "&*", *_all_keys_but(Keys(queue).completed)]
    admin.execute_command("ACL", "SETUSER", *narrow)
    host, port = private_redis.url.split("//")[1].split("/")[0].split(":")
    consumer_url = f"redis://narrow:pw@{host}:{port}/0"
    q = echomq.Queue(queue, redis_url=private_redis.url)
    job_id = q.add("one", None)

    runs: list[str] = []

    def handler(job: echomq.Job) -> str:
        runs.append(job.id)
        return "fine"

    consumer = echomq.Consumer(queue, handler, redis_url=consumer_url, concurrency=4,
                               lease_ms=60_000)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        # the moment: the settle of the finished job has been refused
        _wait_until(lambda: any(entry.get("username") == "narrow"
                                for entry in admin.acl_log()), 20, "the refused settle")
        admin.execute_command("ACL", "SETUSER", "narrow", "allkeys")
        assert q.result(job_id, timeout=20) == "fine"
        assert runs == [job_id]
        assert q.counts()["active"] == 0
    finally:
        consumer.stop()
        thread.join(30)
        consumer.close()
        admin.close()


def _errors(admin: redis.Redis, code: str) -> int:
    stat = admin.info("errorstats").get(f"errorstat_{code}")
    return int(stat["count"]) if stat else 0


@pytest.mark.timeout(60)
def test_a_settle_failing_with_a_script_error_is_kept_and_sent_again(
        private_redis: LocalRedis) -> None:
    queue = "script-error"
    keys = Keys(queue)
    admin = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue, redis_url=private_redis.url)
    job_id = q.add("one", None)
    started, finish = threading.Event(), threading.Event()
    runs: list[str] = []

    def handler(job: echomq.Job) -> str:
        runs.append(job.id)
        started.set()
        assert finish.wait(30)
        return "fine"

    consumer = echomq.Consumer(queue, handler, redis_url=private_redis.url, concurrency=4,
                               lease_ms=60_000)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert started.wait(20)
        # the settle meets a job key of the wrong kind: the script fails (WRONGTYPE), no
        # outage, before it writes anything
        saved = admin.hgetall(keys.job(job_id))
        before = _errors(admin, "WRONGTYPE")
        admin.delete(keys.job(job_id))
        admin.set(keys.job(job_id), "not a hash")
        finish.set()
        _wait_until(lambda: _errors(admin, "WRONGTYPE") > before, 20, "the failed settle")
        admin.delete(keys.job(job_id))
        admin.hset(keys.job(job_id), mapping=saved)  # type: ignore[arg-type]
        assert q.result(job_id, timeout=20) == "fine"
        assert runs == [job_id]
        assert q.counts()["active"] == 0
    finally:
        finish.set()
        consumer.stop()
        thread.join(30)
        consumer.close()
        admin.close()


@pytest.mark.timeout(60)
def test_a_settle_that_always_fails_is_given_up_and_holds_no_later_job(
        private_redis: LocalRedis) -> None:
    queue = "poisoned"
    keys = Keys(queue)
    admin = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue, redis_url=private_redis.url)
    poisoned = q.add("one", None)
    started, finish = threading.Event(), threading.Event()

    def handler(job: echomq.Job) -> str:
        if job.id == poisoned:
            started.set()
            assert finish.wait(30)
        return "fine"

    consumer = echomq.Consumer(queue, handler, redis_url=private_redis.url, concurrency=4,
                               lease_ms=60_000)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert started.wait(20)
        admin.delete(keys.job(poisoned))
        admin.set(keys.job(poisoned), "not a hash")  # for good: every settle with it fails
        finish.set()
        later = q.add("two", None)
        assert q.result(later, timeout=30) == "fine"
        _wait_until(lambda: poisoned not in consumer._held, 20, "the poisoned job let go")
    finally:
        finish.set()
        consumer.stop()
        thread.join(30)
        consumer.close()
        admin.close()
