"""echomq.Middleware: before_add on the producer (may veto), before_job, after_job and
on_failure around each job of a standalone Consumer, for sync, thread-pool and async
handlers; a hook that raises is logged and changes no outcome."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
import redis

import echomq
from echomq.runner import Runner


class Recorder(echomq.Middleware):
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

    def note(self, *entry: Any) -> None:
        with self.lock:
            self.seen.append(entry)

    def before_job(self, job: echomq.Job) -> None:
        current = echomq.current_job()
        self.note("before", job.id, current is job)

    def after_job(self, job: echomq.Job, result: Any) -> None:
        self.note("after", job.id, result)

    def on_failure(self, job: echomq.Job, exc: BaseException, will_retry: bool) -> None:
        self.note("failure", job.id, type(exc).__name__, will_retry)


class AsyncRecorder(Recorder):
    async def before_job(self, job: echomq.Job) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.note("before", job.id, echomq.current_job() is job)

    async def after_job(self, job: echomq.Job, result: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.note("after", job.id, result)

    async def on_failure(self, job: echomq.Job, exc: BaseException,  # type: ignore[override]
                         will_retry: bool) -> None:
        await asyncio.sleep(0)
        self.note("failure", job.id, type(exc).__name__, will_retry)


def _work(job: echomq.Job) -> Any:
    kind = job.payload["kind"]
    if kind == "fail":
        raise ValueError("boom")
    if kind == "fatal":
        raise echomq.Fail("no point retrying")
    return job.payload["n"] * 2


def sync_handler(job: echomq.Job) -> Any:
    return _work(job)


async def async_handler(job: echomq.Job) -> Any:
    await asyncio.sleep(0)
    return _work(job)


def _jobs(q: echomq.Queue) -> dict[str, str]:
    ids = {}
    for n in range(3):
        ids[f"ok{n}"] = q.add("w", {"kind": "ok", "n": n})
    ids["retry"] = q.add("w", {"kind": "fail"}, max_attempts=2, backoff=600.0)
    ids["last"] = q.add("w", {"kind": "fail"}, max_attempts=1)
    ids["fatal"] = q.add("w", {"kind": "fatal"}, max_attempts=5)
    return ids


@pytest.mark.parametrize(("handler", "concurrency", "recorder"), [
    (sync_handler, 1, Recorder), (sync_handler, 4, Recorder), (async_handler, 1, AsyncRecorder),
    (async_handler, 4, AsyncRecorder), (async_handler, 4, Recorder)],
    ids=["sync", "thread-pool", "async", "async-concurrent", "async-sync-hooks"])
def test_hooks_run_around_each_job(redis_url: str, queue_name: str, handler: Any,
                                   concurrency: int, recorder: type[Recorder]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = _jobs(q)
    mw = recorder()
    echomq.Consumer(q, handler, middleware=[mw], concurrency=concurrency).run(burst=True)
    by_job: dict[str, list[tuple[Any, ...]]] = {}
    for entry in mw.seen:
        by_job.setdefault(entry[1], []).append(entry)
    for n in range(3):
        assert by_job[ids[f"ok{n}"]] == [("before", ids[f"ok{n}"], True),
                                         ("after", ids[f"ok{n}"], n * 2)]
    assert by_job[ids["retry"]] == [("before", ids["retry"], True),
                                    ("failure", ids["retry"], "ValueError", True)]
    assert by_job[ids["last"]] == [("before", ids["last"], True),
                                   ("failure", ids["last"], "ValueError", False)]
    assert by_job[ids["fatal"]] == [("before", ids["fatal"], True),
                                    ("failure", ids["fatal"], "Fail", False)]


class Broken(echomq.Middleware):
    def before_job(self, job: echomq.Job) -> None:
        raise RuntimeError("before broke")

    def after_job(self, job: echomq.Job, result: Any) -> None:
        raise RuntimeError("after broke")

    def on_failure(self, job: echomq.Job, exc: BaseException, will_retry: bool) -> None:
        raise RuntimeError("on_failure broke")


@pytest.mark.parametrize(("handler", "concurrency"), [
    (sync_handler, 1), (sync_handler, 4), (async_handler, 2)],
    ids=["sync", "thread-pool", "async"])
def test_a_raising_hook_is_logged_and_changes_no_outcome(
        redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture, handler: Any,
        concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ok = q.add("w", {"kind": "ok", "n": 4})
    bad = q.add("w", {"kind": "fail"}, max_attempts=1)
    after = Recorder()  # a later middleware still runs
    with caplog.at_level(logging.ERROR, logger="echomq.middleware"):
        echomq.Consumer(q, handler, middleware=[Broken(), after],
                        concurrency=concurrency).run(burst=True)
    done, dead = q.get(ok), q.get(bad)
    assert done is not None and done.state == "completed" and done.result == 8
    assert dead is not None and dead.state == "dead" and "boom" in (dead.error or "")
    text = caplog.text
    assert "Broken.before_job raised" in text and "Broken.after_job raised" in text
    assert "Broken.on_failure raised" in text
    assert ("after", ok, 8) in after.seen and ("failure", bad, "ValueError", False) in after.seen


class Veto(echomq.Middleware):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, Any]] = []

    def before_add(self, queue: str, job_id: str, name: str, payload: Any) -> None:
        self.seen.append((queue, job_id, name, payload))
        if payload.get("forbidden"):
            raise PermissionError("not this one")


def test_before_add_sees_each_job_and_may_veto(redis_url: str, queue_name: str) -> None:
    veto = Veto()
    q = echomq.Queue(queue_name, redis_url=redis_url, middleware=[veto])
    jid = q.add("send", {"to": "a"}, job_id="j1")
    assert veto.seen == [(queue_name, "j1", "send", {"to": "a"})] and jid == "j1"
    with pytest.raises(PermissionError):
        q.add("send", {"forbidden": True}, job_id="j2")
    with pytest.raises(PermissionError):
        q.add_many([("send", {"to": "b"}, {"job_id": "j3"}), ("send", {"forbidden": True})])
    assert q.get("j1") is not None
    assert q.get("j2") is None and q.get("j3") is None, "a vetoed call admits nothing"
    assert q.counts()["waiting"] == 1


def test_aio_before_add_is_awaited_and_may_veto(redis_url: str, queue_name: str) -> None:
    seen: list[str] = []

    class AsyncVeto(echomq.Middleware):
        async def before_add(self, queue: str, job_id: str, name: str, payload: Any) -> None:
            await asyncio.sleep(0)
            seen.append(job_id)
            if payload.get("forbidden"):
                raise PermissionError("not this one")

    async def main() -> None:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url, middleware=[AsyncVeto()])
        try:
            await aq.add("send", {}, job_id="a1")
            await aq.add_many([("send", {}, {"job_id": "a2"})])
            with pytest.raises(PermissionError):
                await aq.add("send", {"forbidden": True}, job_id="a3")
            with pytest.raises(PermissionError):
                await aq.add_many([("send", {}, {"job_id": "a4"}),
                                   ("send", {"forbidden": True}, {"job_id": "a5"})])
        finally:
            await aq.close()

    asyncio.run(main())
    assert seen == ["a1", "a2", "a3", "a4", "a5"]
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert [q.get(j) is not None for j in ("a1", "a2", "a3", "a4")] == [True, True, False, False]


def test_a_consumer_takes_the_middleware_of_the_queue_it_is_given(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    mw = Recorder()
    q = echomq.Queue(queue_name, redis_url=redis_url, middleware=[mw])
    jid = q.add("w", {"kind": "ok", "n": 1})
    echomq.Consumer(q, sync_handler).run(burst=True)
    assert mw.seen == [("before", jid, True), ("after", jid, 2)]


def test_no_hook_to_call_means_no_hooks_on_the_path() -> None:
    settings = echomq.QueueSettings()
    assert Runner("q", sync_handler, settings).hooks is None
    assert Runner("q", sync_handler, settings, middleware=[echomq.Middleware()]).hooks is None
    assert Runner("q", sync_handler, settings, middleware=[Recorder()]).hooks is not None
