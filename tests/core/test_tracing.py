"""Optional OpenTelemetry: add() carries the active trace context in the job, and the
consumer runs the handler in a CONSUMER span linked to it.

opentelemetry-api alone records nothing, so the test gives the API a small recording
tracer (in place of an SDK) and checks the spans the consumer asked it for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import echomq

trace = pytest.importorskip("opentelemetry.trace")

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


class RecordingTracer(trace.Tracer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []

    def start_span(self, name: str, context: Any = None, kind: Any = None,
                   attributes: Any = None, links: Any = None, **_: Any) -> Any:
        self.spans.append({"name": name, "kind": kind, "links": list(links or []),
                           "attributes": dict(attributes or {})})
        return trace.NonRecordingSpan(trace.SpanContext(
            TRACE_ID + len(self.spans), 0x1000 + len(self.spans), is_remote=False,
            trace_flags=trace.TraceFlags(1)))

    @contextlib.contextmanager
    def start_as_current_span(self, name: str, **kwargs: Any) -> Iterator[Any]:
        span = self.start_span(name, **kwargs)
        with trace.use_span(span, end_on_exit=True):
            yield span


def _producer_span() -> Any:
    return trace.NonRecordingSpan(trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=False,
                                                    trace_flags=trace.TraceFlags(1)))


def test_add_carries_the_trace_context_and_the_handler_runs_in_a_linked_span(
        redis_url: str, queue_name: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    tracer = RecordingTracer()
    monkeypatch.setattr(trace, "get_tracer", lambda *a, **k: tracer)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with trace.use_span(_producer_span()):
        traced = q.add("send", {"n": 1})
        later = q.add("send", {"n": 2}, delay=0.01)
    plain = q.add("send", {"n": 3})
    parent = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    assert r.hget(q.keys.job(traced), "trace") == parent.encode()
    assert r.hget(q.keys.job(later), "trace") == parent.encode()
    assert r.hget(q.keys.job(plain), "trace") is None

    seen: dict[str, int] = {}

    def handler(job: echomq.Job) -> None:
        seen[job.id] = trace.get_current_span().get_span_context().trace_id

    r.zadd(q.keys.schedule, {later: 0})
    echomq.Consumer(q, handler).run(burst=True)
    assert set(seen) == {traced, later, plain}
    assert len(tracer.spans) == 2, "only traced jobs get a span"
    for span in tracer.spans:
        assert span["kind"] == trace.SpanKind.CONSUMER
        [link] = span["links"]
        assert (link.context.trace_id, link.context.span_id) == (TRACE_ID, SPAN_ID)
        assert span["attributes"]["messaging.destination.name"] == queue_name
    assert seen[traced] != TRACE_ID and seen[plain] == 0  # its own span; none for plain
