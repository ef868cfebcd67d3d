"""SentryMiddleware: a handler's exception reaches Sentry (an in-memory transport, no
network), tagged with the job and under the job's trace; every attempt or only the last."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import echomq

sentry_sdk = pytest.importorskip("sentry_sdk")
trace = pytest.importorskip("opentelemetry.trace")
from sentry_sdk.transport import Transport  # noqa: E402

from echomq.contrib.sentry import SentryMiddleware  # noqa: E402

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


class Captured(Transport):  # type: ignore[misc]
    events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        event = envelope.get_event()
        if event is not None:
            Captured.events.append(event)


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    Captured.events = []
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=Captured,
                    default_integrations=False)
    yield Captured.events
    sentry_sdk.get_client().close()
    sentry_sdk.init()  # no DSN: inactive again


def failing(job: echomq.Job) -> None:
    raise ValueError(f"boom {job.payload['n']}")


async def failing_async(job: echomq.Job) -> None:
    await asyncio.sleep(0)
    raise ValueError(f"boom {job.payload['n']}")


@pytest.mark.parametrize(("handler", "concurrency"), [
    (failing, 1), (failing, 3), (failing_async, 3)], ids=["sync", "thread-pool", "async"])
def test_every_failed_attempt_is_captured_with_the_job_tags(
        redis_url: str, queue_name: str, events: list[dict[str, Any]], handler: Any,
        concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    retry = q.add("w", {"n": 1}, lane="eu", max_attempts=2, backoff=600.0)
    last = q.add("w", {"n": 2}, max_attempts=1)
    echomq.Consumer(q, handler, middleware=[SentryMiddleware()],
                    concurrency=concurrency).run(burst=True)
    by_job = {e["tags"]["echomq.job_id"]: e for e in events}
    assert set(by_job) == {retry, last}
    tags = by_job[retry]["tags"]
    assert (tags["echomq.queue"], tags["echomq.name"], tags["echomq.lane"],
            tags["echomq.attempt"]) == (queue_name, "w", "eu", 1)
    assert by_job[retry]["contexts"]["echomq.job"]["will_retry"] is True
    assert by_job[last]["contexts"]["echomq.job"]["will_retry"] is False
    [exc] = by_job[last]["exception"]["values"]
    assert exc["type"] == "ValueError" and exc["value"] == "boom 2"
    assert exc["mechanism"] == {"type": "echomq", "handled": False}


def test_only_the_last_attempt_when_asked(redis_url: str, queue_name: str,
                                          events: list[dict[str, Any]]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("w", {"n": 1}, max_attempts=2, backoff=600.0)
    last = q.add("w", {"n": 2}, max_attempts=1)
    echomq.Consumer(q, failing, middleware=[SentryMiddleware(every_attempt=False)]
                    ).run(burst=True)
    assert [e["tags"]["echomq.job_id"] for e in events] == [last]


def test_the_event_is_under_the_trace_of_the_add(redis_url: str, queue_name: str,
                                                 events: list[dict[str, Any]]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    parent = trace.NonRecordingSpan(trace.SpanContext(
        TRACE_ID, SPAN_ID, is_remote=False, trace_flags=trace.TraceFlags(1)))
    with trace.use_span(parent):
        q.add("w", {"n": 3}, max_attempts=1)
    q.add("w", {"n": 4}, max_attempts=1)  # not traced: a trace of its own
    echomq.Consumer(q, failing, middleware=[SentryMiddleware()]).run(burst=True)
    traces = {e["exception"]["values"][0]["value"]: e["contexts"]["trace"]["trace_id"]
              for e in events}
    assert traces["boom 3"] == f"{TRACE_ID:032x}"
    assert traces["boom 4"] != f"{TRACE_ID:032x}"


def test_nothing_is_sent_without_a_sentry_client(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("w", {"n": 5}, max_attempts=1)
    echomq.Consumer(q, failing, middleware=[SentryMiddleware()]).run(burst=True)
    assert q.get(jid).state == "dead"  # type: ignore[union-attr]
