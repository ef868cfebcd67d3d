"""OpenTelemetry: add() runs in a PRODUCER span whose context the job carries (add_many:
one span for the batch, with its count), and the consumer runs the handler in a CONSUMER
span linked to it, both with the ``messaging.*`` attributes. Recorded by the SDK's
in-memory exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import echomq

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)  # as if set globally
    yield exporter
    provider.shutdown()


def _traceparent(span: Any) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_add_runs_in_a_producer_span_the_consumer_span_links_to(
        redis_url: str, queue_name: str, r: redis.Redis, spans: InMemorySpanExporter) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    app = trace.get_tracer("app")
    with app.start_as_current_span("request") as request:
        jid = q.add("send", {"n": 1})
        later = q.add("send", {"n": 2}, delay=0.01)
    [producer, deferred, parent] = spans.get_finished_spans()
    assert parent.name == "request"
    for span, job_id in ((producer, jid), (deferred, later)):
        assert span.kind == trace.SpanKind.PRODUCER and span.name == f"send {queue_name}"
        assert span.parent.span_id == request.get_span_context().span_id
        assert span.attributes["messaging.system"] == "echomq"
        assert span.attributes["messaging.destination.name"] == queue_name
        assert span.attributes["messaging.operation.type"] == "send"
        assert span.attributes["messaging.message.id"] == job_id
        assert r.hget(q.keys.job(job_id), "trace") == _traceparent(span).encode()

    seen: dict[str, int] = {}

    def handler(job: echomq.Job) -> None:
        seen[job.id] = trace.get_current_span().get_span_context().span_id

    r.zadd(q.keys.schedule, {later: 0})
    spans.clear()
    echomq.Consumer(q, handler).run(burst=True)
    consumers = spans.get_finished_spans()
    assert len(consumers) == 2
    linked = {}
    for span in consumers:
        assert span.kind == trace.SpanKind.CONSUMER
        assert span.attributes["messaging.operation.type"] == "process"
        [link] = span.links
        linked[span.attributes["messaging.message.id"]] = link.context.span_id
        assert seen[span.attributes["messaging.message.id"]] == span.context.span_id
    assert linked == {jid: producer.context.span_id, later: deferred.context.span_id}


def test_add_many_is_one_producer_span_with_the_count(
        redis_url: str, queue_name: str, r: redis.Redis, spans: InMemorySpanExporter) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("send", {"n": i}) for i in range(3)])
    [producer] = spans.get_finished_spans()
    assert producer.kind == trace.SpanKind.PRODUCER and producer.parent is None
    assert producer.attributes["messaging.batch.message_count"] == 3
    assert producer.attributes["messaging.operation.name"] == "add_many"
    assert {r.hget(q.keys.job(j), "trace") for j in ids} == {_traceparent(producer).encode()}
    spans.clear()
    echomq.Consumer(q, lambda job: None).run(burst=True)
    consumers = spans.get_finished_spans()
    assert len(consumers) == 3
    assert {s.links[0].context.span_id for s in consumers} == {producer.context.span_id}


def test_aio_add_runs_in_a_producer_span(redis_url: str, queue_name: str, r: redis.Redis,
                                         spans: InMemorySpanExporter) -> None:
    async def main() -> tuple[str, list[str]]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            return await aq.add("send", {}), await aq.add_many([("a", {}), ("b", {})])
        finally:
            await aq.close()

    one, many = asyncio.run(main())
    single, batch = spans.get_finished_spans()
    assert single.kind == batch.kind == trace.SpanKind.PRODUCER
    assert single.attributes["messaging.message.id"] == one
    assert batch.attributes["messaging.batch.message_count"] == 2
    assert r.hget(echomq.Queue(queue_name, redis_url=redis_url).keys.job(one), "trace") == \
        _traceparent(single).encode()


def test_without_a_tracer_provider_jobs_carry_no_trace(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("send", {})
    assert r.hget(q.keys.job(jid), "trace") is None


def test_without_a_tracer_provider_an_outer_context_still_travels_in_the_job(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """No provider set (the add makes no span), but a context the application extracted
    (a request's traceparent) is carried by the job, as a consumer's link needs."""
    from opentelemetry import context as otel_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx = TraceContextTextMapPropagator().extract({"traceparent": incoming})
    q = echomq.Queue(queue_name, redis_url=redis_url)
    token = otel_context.attach(ctx)
    try:
        jid = q.add("send", {})
    finally:
        otel_context.detach(token)
    assert r.hget(q.keys.job(jid), "trace") == incoming.encode()


def test_a_workflow_is_one_producer_span_every_job_carries(
        redis_url: str, queue_name: str, r: redis.Redis, spans: InMemorySpanExporter) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.one", redis_url=redis_url)
    def one(*_: object) -> int:
        return 1

    wf = echomq.chord(echomq.group(one.s() for _ in range(3)), one.s()).send()
    [producer] = spans.get_finished_spans()
    assert producer.kind == trace.SpanKind.PRODUCER and producer.name == f"send {queue_name}"
    assert producer.attributes["messaging.operation.name"] == "workflow"
    assert producer.attributes["messaging.batch.message_count"] == 4
    assert producer.attributes["echomq.workflow.id"] == wf.id
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert {r.hget(q.keys.job(j), "trace") for j in wf.job_ids} == {
        _traceparent(producer).encode()}
