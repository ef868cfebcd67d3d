"""Handlers of every kind in the standalone Consumer: async, Retry/Fail, time limits, progress."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import echomq
from echomq.keys import Keys


@pytest.fixture
def run_in_thread() -> Iterator[Callable[[echomq.Consumer], threading.Thread]]:
    running: list[tuple[echomq.Consumer, threading.Thread]] = []

    def start(consumer: echomq.Consumer) -> threading.Thread:
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        running.append((consumer, thread))
        return thread

    yield start
    for consumer, thread in running:
        consumer.stop()
        thread.join(10)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


def test_an_async_handler_runs_and_its_return_value_is_the_result(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"n": 2})

    async def handler(job: echomq.Job) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"double": job.payload["n"] * 2}

    assert echomq.Consumer(queue_name, handler, redis_url=redis_url).run(burst=True) == 1
    job = q.get(job_id)
    assert job is not None and job.state == "completed" and job.result == {"double": 4}


def test_a_sync_handler_that_returns_an_awaitable_is_awaited(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", 5)

    async def later(n: int) -> int:
        await asyncio.sleep(0)
        return n + 1

    echomq.Consumer(queue_name, lambda job: later(job.payload),
                    redis_url=redis_url).run(burst=True)
    job = q.get(job_id)
    assert job is not None and job.result == 6


def test_an_async_job_past_its_limit_is_cancelled_fails_timed_out_and_is_retried(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None, timeout=0.2, max_attempts=2, backoff=0)
    cancelled = []

    async def handler(job: echomq.Job) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(job.attempts)
            raise

    t0 = time.monotonic()
    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url, beat_ms=50)
    while q.get(job_id).state != "dead":  # type: ignore[union-attr]
        consumer.run(burst=True)
        assert time.monotonic() - t0 < 20
    job = q.get(job_id)
    assert job is not None and job.attempts == 2 and job.timeout == 0.2
    assert "timed out after 0.2 s" in (job.error or "")
    assert cancelled == [1, 2]


def test_job_timeout_is_the_default_limit(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None, max_attempts=1)

    async def handler(job: echomq.Job) -> None:
        await asyncio.sleep(30)

    echomq.Consumer(queue_name, handler, redis_url=redis_url, job_timeout=0.1).run(burst=True)
    job = q.get(job_id)
    assert job is not None and job.state == "dead" and "timed out after 0.1 s" in job.error


def test_timeout_is_stored_in_the_job_hash_and_bad_values_are_refused(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    now = q.add("x", None, timeout=1.5)
    later = q.add_many([("x", None, {"timeout": 2, "delay": 60})])[0]
    plain = q.add("x", None)
    assert r.hget(Keys(queue_name).job(now), "timeout_ms") == b"1500"
    assert q.get(now).timeout == 1.5 and q.get(later).timeout == 2.0  # type: ignore[union-attr]
    assert q.get(plain).timeout is None  # type: ignore[union-attr]
    for bad in (0, -1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="timeout"):
            q.add("x", None, timeout=bad)  # type: ignore[arg-type]
    assert q.counts()["waiting"] == 2


def test_retry_reschedules_after_its_delay_and_fail_goes_dead_at_once(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    retried = q.add("retry", None, max_attempts=5)
    failed = q.add("fail", None, max_attempts=5)

    def retry(job: echomq.Job) -> str:
        if job.attempts == 1:
            raise echomq.Retry(delay=0.3)
        return "second time"

    def fail(job: echomq.Job) -> None:
        raise echomq.Fail("bad input")

    consumer = echomq.Consumer(queue_name, {"retry": retry, "fail": fail},
                               redis_url=redis_url, beat_ms=50)
    consumer.run(burst=True)
    job = q.get(retried)
    assert job is not None and job.state == "scheduled" and "Retry(delay=0.3)" in job.error
    assert job.due_ms is not None and job.due_ms - (job.started_ms or 0) >= 290
    dead = q.get(failed)
    assert dead is not None and dead.state == "dead" and dead.attempts == 1
    assert "Fail: bad input" in (dead.error or "")
    t0 = time.monotonic()
    while q.get(retried).state != "completed":  # type: ignore[union-attr]
        consumer.run(burst=True)
        assert time.monotonic() - t0 < 10
    assert q.get(retried).result == "second time"  # type: ignore[union-attr]


def test_progress_is_readable_while_the_job_runs_and_extends_its_lease(
        redis_url: str, queue_name: str, r: redis.Redis,
        run_in_thread: Callable[[echomq.Consumer], threading.Thread]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None)
    reported = threading.Event()
    finish = threading.Event()

    go = threading.Event()

    def handler(job: echomq.Job) -> str:
        go.wait(10)
        job.progress({"done": 50})
        reported.set()
        finish.wait(10)
        return "ok"

    def lease() -> float:
        return float(r.zscore(Keys(queue_name).leases, job_id) or 0)

    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url, lease_ms=60_000)
    run_in_thread(consumer)
    _wait(lambda: q.get(job_id).state == "active", 10, "the job to start")  # type: ignore[union-attr]
    # bring the lease close to its end, as if the job had run a long time
    soon = lease() - 59_000
    r.zadd(Keys(queue_name).leases, {job_id: soon}, xx=True)
    go.set()
    assert reported.wait(10)
    job = q.get(job_id)
    assert job is not None and job.state == "active" and job.progress == {"done": 50}
    assert lease() > soon + 50_000
    finish.set()
    _wait(lambda: q.get(job_id).state == "completed", 10, "the job to finish")  # type: ignore[union-attr]
    assert q.get(job_id).progress == {"done": 50}  # type: ignore[union-attr]


def test_progress_refuses_what_is_not_small_json(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", None, max_attempts=1)
    errors: list[str] = []

    def handler(job: echomq.Job) -> None:
        for bad in ({1, 2}, "x" * 20_000):
            try:
                job.progress(bad)
            except echomq.PayloadError as exc:
                errors.append(str(exc))

    echomq.Consumer(queue_name, handler, redis_url=redis_url).run(burst=True)
    assert len(errors) == 2


def test_concurrency_runs_sync_handlers_in_threads(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", None) for _ in range(40)])
    threads: set[str] = set()
    lock = threading.Lock()

    def handler(job: echomq.Job) -> None:
        with lock:
            threads.add(threading.current_thread().name)
        time.sleep(0.05)  # simulated blocking work inside the job

    t0 = time.monotonic()
    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url, concurrency=20)
    assert consumer.run(burst=True) == 40
    assert q.counts()["completed"] == 40
    assert len(threads) > 1
    assert time.monotonic() - t0 < 5  # 40 × 50 ms in one thread would be 2 s at least
