"""Inside a handler (sync, thread pool, async) every log record carries job_id, queue, lane
and attempt; records logged outside a job carry none of them."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import echomq
from echomq.logcontext import JobContextFilter

log = logging.getLogger("app.test")


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.lock2:
            self.records.append(record)


@pytest.fixture
def collected() -> Iterator[Collect]:
    handler = Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old)


def sync_handler(job: echomq.Job) -> None:
    log.info("in %s", job.id)


def pool_handler(job: echomq.Job) -> None:
    threading.Event().wait(0.005)
    log.info("in %s", job.id)


async def async_handler(job: echomq.Job) -> None:
    await asyncio.sleep(0.005)
    log.info("in %s", job.id)


@pytest.mark.parametrize(("handler", "concurrency"), [
    (sync_handler, 1), (pool_handler, 4), (async_handler, 4)], ids=["sync", "pool", "async"])
def test_records_inside_a_handler_carry_the_job_and_nothing_leaks(
        redis_url: str, queue_name: str, collected: Collect, handler: Any,
        concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = {q.add("w", {}, lane=f"lane{i % 3}"): f"lane{i % 3}" for i in range(12)}
    echomq.Consumer(q, handler, concurrency=concurrency).run(burst=True)
    log.info("after the jobs")
    inside = [rec for rec in collected.records if rec.getMessage().startswith("in ")]
    assert len(inside) == len(ids)
    for rec in inside:
        jid = rec.getMessage()[3:]
        assert (rec.job_id, rec.queue, rec.lane, rec.attempt) == (  # type: ignore[attr-defined]
            jid, queue_name, ids[jid], 1)
    [after] = [rec for rec in collected.records if rec.getMessage() == "after the jobs"]
    assert not hasattr(after, "job_id") and not hasattr(after, "lane")


def test_an_extra_value_is_kept_and_a_formatter_prints_the_fields() -> None:
    from echomq.current import CURRENT

    job = echomq.Job(id="j1", name="n", payload=None, lane="l", state="active", queue="q",
                     attempts=2)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.lane = "mine"
    token = CURRENT.set(job)
    try:
        assert JobContextFilter().filter(record)
    finally:
        CURRENT.reset(token)
    fmt = logging.Formatter("%(job_id)s %(queue)s %(lane)s %(attempt)s %(message)s")
    assert fmt.format(record) == "j1 q mine 2 m"
