"""Cancel of an active job on the real server: one outcome whichever script runs first, the
lane slot freed, the result waiter told; a standalone consumer stops the handler."""

from __future__ import annotations

import asyncio
import threading

import pytest

import echomq
from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled
from echomq.stopping import JobCancelled


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def test_a_settle_that_runs_first_wins_and_the_cancel_is_refused(redis_url: str,
                                                                queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", {})
    lanes = _lanes(q)
    [c] = lanes.claim(1)
    assert lanes.settle([Outcome(c.id, c.token, "c", "1")]) == [Settled.COMPLETED]
    assert q.cancel(jid) is False
    job = q.get(jid)
    assert job is not None and job.state == "completed" and job.error is None


def test_a_cancel_that_runs_first_wins_and_the_settle_is_stale(redis_url: str,
                                                              queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", {}, max_attempts=5)
    lanes = _lanes(q)
    [c] = lanes.claim(1)
    assert q.cancel(jid) is True
    for outcome in ("c", "f"):  # neither completed nor retried
        assert lanes.settle([Outcome(c.id, c.token, outcome, "x", 0)]) == [Settled.STALE]
    job = q.get(jid)
    assert job is not None and job.state == "cancelled" and job.error == "cancelled while running"
    assert q.counts()["cancelled"] == 1 and q.counts()["active"] == 0
    with pytest.raises(echomq.JobFailed, match="cancelled while running"):
        q.result(jid, timeout=1)
    assert q.cancel(jid) is False  # already ended


def test_cancel_of_an_active_job_frees_its_lane_slot(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("one", max_active=1)
    first = q.add("x", {}, lane="one")
    second = q.add("x", {}, lane="one")
    lanes = _lanes(q)
    assert [c.id for c in lanes.claim(5)] == [first]
    assert lanes.claim(5) == []  # the lane is at its limit
    assert q.cancel(first) is True
    assert [c.id for c in lanes.claim(5)] == [second]


def test_a_waiter_on_the_result_is_woken_by_the_cancel(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", {})
    _lanes(q).claim(1)
    seen: list[BaseException] = []

    def wait() -> None:
        try:
            q.result(jid, timeout=20)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            seen.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert q.cancel(jid) is True
    waiter.join(10)
    assert not waiter.is_alive()
    assert isinstance(seen[0], echomq.JobFailed)


def test_async_producer_cancels_an_active_job(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", {})
    _lanes(q).claim(1)

    async def go() -> bool:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            return await aq.cancel(jid)
        finally:
            await aq.close()

    assert asyncio.run(go()) is True
    assert q.get(jid).error == "cancelled while running"  # type: ignore[union-attr]


def _run_consumer(consumer: echomq.Consumer) -> threading.Thread:
    t = threading.Thread(target=consumer.run, daemon=True)
    t.start()
    return t


def test_a_standalone_sync_handler_stops_at_its_next_progress(redis_url: str,
                                                              queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    started, cancelled, raised = threading.Event(), threading.Event(), []

    def handler(job: echomq.Job) -> str:
        started.set()
        cancelled.wait(20)
        try:
            job.progress(1)
        except JobCancelled as exc:
            raised.append(exc)
            raise
        return "finished"

    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url, beat_ms=100)
    t = _run_consumer(consumer)
    jid = q.add("x", {}, max_attempts=3)
    assert started.wait(10)
    assert q.cancel(jid) is True
    cancelled.set()
    after = q.add("x", {})
    assert q.result(after, timeout=10) == "finished"
    consumer.stop()
    t.join(10)
    assert len(raised) == 1 and raised[0].job_id == jid
    job = q.get(jid)
    assert job is not None and job.state == "cancelled" and job.attempts == 1


def test_a_standalone_sync_handler_without_progress_is_recorded_cancelled(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    started, cancelled = threading.Event(), threading.Event()

    def handler(job: echomq.Job) -> str:
        started.set()
        cancelled.wait(20)
        return "finished"

    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url, beat_ms=100)
    t = _run_consumer(consumer)
    jid = q.add("x", {})
    assert started.wait(10)
    assert q.cancel(jid) is True
    cancelled.set()
    after = q.add("x", {})
    assert q.result(after, timeout=10) == "finished"
    consumer.stop()
    t.join(10)
    job = q.get(jid)
    assert job is not None and job.state == "cancelled" and job.result is None


def test_a_standalone_async_handler_is_cancelled(redis_url: str, queue_name: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    started, seen = threading.Event(), []

    async def handler(job: echomq.Job) -> str:
        if job.payload.get("wait"):
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen.append(job.id)
                raise
        return "finished"

    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url, beat_ms=100)
    t = _run_consumer(consumer)
    jid = q.add("x", {"wait": True})
    assert started.wait(10)
    assert q.cancel(jid) is True
    after = q.add("x", {})
    assert q.result(after, timeout=10) == "finished"
    consumer.stop()
    t.join(10)
    assert not t.is_alive() and seen == [jid]
    assert not [r for r in caplog.records if "will retry" in r.getMessage()]  # not a failure
    assert q.get(jid).state == "cancelled"  # type: ignore[union-attr]


def test_cancel_of_an_unknown_job_is_false(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.cancel("nope") is False
