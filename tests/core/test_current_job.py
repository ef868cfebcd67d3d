"""``echomq.current_job()``: the running Job inside any handler, sync or async, one at a
time or several at once; None outside a job."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import echomq


@pytest.fixture
def run_consumer(redis_url: str) -> Iterator[Any]:
    running: list[echomq.Consumer] = []

    def start(queue: str, handler: Any, **options: Any) -> None:
        c = echomq.Consumer(queue, handler, redis_url=redis_url, beat_ms=200, **options)
        threading.Thread(target=c.run, daemon=True).start()
        running.append(c)

    yield start
    for c in running:
        c.stop()


def _seen(job: echomq.Job) -> dict[str, Any]:
    current = echomq.current_job()
    assert current is not None
    return {"same": current is job, "id": current.id, "lane": current.lane,
            "attempts": current.attempts, "name": current.name}


def sync_handler(job: echomq.Job) -> dict[str, Any]:
    return _seen(job)


async def async_handler(job: echomq.Job) -> dict[str, Any]:
    await asyncio.sleep(0.01)  # other jobs run meanwhile when concurrency > 1
    return _seen(job)


def threaded_handler(job: echomq.Job) -> dict[str, Any]:
    threading.Event().wait(0.01)  # other threads run jobs meanwhile
    return _seen(job)


def test_outside_a_job_there_is_none() -> None:
    assert echomq.current_job() is None


@pytest.mark.parametrize(("handler", "concurrency"), [
    (sync_handler, 1), (async_handler, 1), (async_handler, 8), (threaded_handler, 8)])
def test_every_handler_sees_its_own_job(run_consumer: Any, redis_url: str, queue_name: str,
                                        handler: Any, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("who", {"i": i}, {"lane": f"lane-{i % 3}"}) for i in range(24)])
    run_consumer(queue_name, handler, concurrency=concurrency)
    for i, job_id in enumerate(ids):
        assert q.result(job_id, timeout=15) == {"same": True, "id": job_id, "lane": f"lane-{i % 3}",
                                                "attempts": 1, "name": "who"}
    assert echomq.current_job() is None


def test_a_task_reads_its_attempt_and_retries(run_consumer: Any, redis_url: str,
                                              queue_name: str) -> None:
    echomq.configure(redis_url=redis_url)
    try:
        @echomq.task(queue=queue_name, name=f"{queue_name}.again", max_attempts=4)
        def again() -> int:
            job = echomq.current_job()
            assert job is not None
            if job.attempts < 3:
                raise echomq.Retry(delay=0.01, reason=f"attempt {job.attempts}")
            return job.attempts

        @echomq.task(queue=queue_name, name=f"{queue_name}.never", max_attempts=4)
        async def never() -> None:
            raise echomq.Fail("not worth another try")

        from echomq.task import tasks_on

        run_consumer(queue_name, tasks_on(queue_name))
        assert again.result(again.send(), timeout=15) == 3
        doomed = never.send()
        with pytest.raises(echomq.JobFailed, match="not worth another try"):
            never.result(doomed, timeout=15)
        job = echomq.Queue(queue_name).get(doomed)
        assert job is not None and (job.state, job.attempts) == ("dead", 1)
    finally:
        echomq.configure(redis_url=None)
