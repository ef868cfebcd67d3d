"""An async handler whose own await raises CancelledError fails like any other error."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import redis

import echomq


def test_a_handler_raising_cancelled_error_is_settled_as_a_failure(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None, max_attempts=2, backoff=30)
    ran = threading.Event()

    async def handler(job: echomq.Job) -> None:
        ran.set()
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()  # e.g. a helper task someone else cancelled
        await inner

    # a plain client: the consumer's asyncio twin of it connects (see test_async_twin.py)
    consumer = echomq.Consumer(queue_name, handler, redis=redis.Redis.from_url(redis_url),
                               concurrency=2, lease_ms=2000, beat_ms=100)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert ran.wait(10), "the handler never ran"
        deadline = time.monotonic() + 6.0  # three lease periods
        pause = threading.Event()
        while (job := q.get(job_id)) is not None and job.state == "active" \
                and time.monotonic() < deadline:
            pause.wait(0.05)
        assert job is not None
        assert job.state == "scheduled" and job.attempts == 1, job  # a failed attempt, retrying
    finally:
        consumer.stop()
        thread.join(10)
        gc.collect()  # the dropped task's unretrieved error is logged here, not mid-import


def test_a_settle_error_in_the_concurrent_drain_does_not_strand_the_other_outcomes(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    # one claim, one settle: the first job's malformed dedup_ms makes settle.lua fail at it
    poison, other = q.add_many([("x", 1), ("x", 2)])
    q.redis.hset(q.keys.job(poison), "dedup_ms", "soon")
    finished = threading.Event()

    async def handler(job: echomq.Job) -> None:
        if job.id == other:
            finished.set()

    consumer = echomq.Consumer(queue_name, handler, redis=redis.Redis.from_url(redis_url),
                               concurrency=2, lease_ms=2000, beat_ms=100)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert finished.wait(10), "the handler never ran"
        deadline = time.monotonic() + 6.0  # three lease periods
        pause = threading.Event()
        while (job := q.get(other)) is not None and job.state == "active" \
                and time.monotonic() < deadline:
            pause.wait(0.05)
        assert job is not None and job.state != "active", job
    finally:
        consumer.stop()
        thread.join(10)
        gc.collect()  # the dropped task's unretrieved error is logged here, not mid-import


def test_a_handler_that_cancels_its_own_task_is_settled_as_a_failure_not_stranded(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None, max_attempts=2, backoff=30)
    ran = threading.Event()

    async def handler(job: echomq.Job) -> None:
        ran.set()
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # e.g. a library aborting "the current request" on an error
        await asyncio.sleep(0)

    consumer = echomq.Consumer(queue_name, handler, redis=redis.Redis.from_url(redis_url),
                               concurrency=2, lease_ms=2000, beat_ms=100)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert ran.wait(10), "the handler never ran"
        deadline = time.monotonic() + 6.0  # three lease periods: the consumer extends it
        pause = threading.Event()
        while (job := q.get(job_id)) is not None and job.state == "active" \
                and time.monotonic() < deadline:
            pause.wait(0.05)
        assert job is not None
        assert job.state == "scheduled" and job.attempts == 1, (
            f"the job is held for ever, neither run nor settled: {job}")
    finally:
        consumer.stop()
        thread.join(10)
        gc.collect()
