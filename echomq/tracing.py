"""Optional OpenTelemetry: the producer's trace context travels in the job, the consumer
runs the handler in a span linked to it. Without ``opentelemetry-api`` installed (extra
``echomq[otel]``) every function here is a cheap no-op.

The context is stored as a W3C ``traceparent`` string in the job's ``trace`` field.
``add()`` runs in a PRODUCER span ("send <queue>"; ``add_many``: one span for the batch,
``messaging.batch.message_count``), so the job carries that span's context and the
CONSUMER span ("<queue> process") links to it. Attributes follow OpenTelemetry's
``messaging.*`` semantic conventions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # optional: tracing is off
    _trace = None  # type: ignore[assignment]

_PROPAGATOR: Any = TraceContextTextMapPropagator() if _trace is not None else None


def current_traceparent() -> str:
    """The active span's context as a ``traceparent`` header value, or "" when none."""
    if _trace is None or not _trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def producer_span(queue: str, operation: str, count: int = 1
                  ) -> contextlib.AbstractContextManager[Any]:
    """Run an admit in a PRODUCER span (yields it, or None without OpenTelemetry or a
    tracer provider); set ``messaging.message.id`` on it once the id is known
    (:func:`note_message_id`)."""
    if _trace is None or _no_provider():  # a span nobody records: skip its cost
        return _NO_SPAN
    return _producer_span(queue, operation, count)


@contextlib.contextmanager
def _producer_span(queue: str, operation: str, count: int) -> Iterator[Any]:
    attributes: dict[str, Any] = {
        "messaging.system": "echomq", "messaging.destination.name": queue,
        "messaging.operation.type": "send", "messaging.operation.name": operation}
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    tracer = _trace.get_tracer("echomq")
    if isinstance(tracer, _trace.NoOpTracer):  # a provider that records nothing (disabled)
        yield None
        return
    with tracer.start_as_current_span(f"send {queue}", kind=_trace.SpanKind.PRODUCER,
                                      attributes=attributes) as span:
        yield span


def _no_provider() -> bool:
    """True when no tracer provider is set (or the no-op one): the API would make a span
    that records nothing and carries no context (an outer span's context still travels
    in the job). One lookup: no tracer is made to find out."""
    return isinstance(_trace.get_tracer_provider(),
                      (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider))


def note_message_id(span: Any, job_id: str) -> None:
    """Record a single admit's job id on its producer span."""
    if span is not None and span.is_recording():
        span.set_attribute("messaging.message.id", job_id)


@contextlib.contextmanager
def handler_span(queue: str, job_name: str, job_id: str, traceparent: str) -> Iterator[None]:
    """Run the body in a CONSUMER span linked to the producer's context (when there is one
    and OpenTelemetry is installed)."""
    if _trace is None or not traceparent:
        yield
        return
    remote = _trace.get_current_span(
        _PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
    links = [_trace.Link(remote)] if remote.is_valid else []
    tracer = _trace.get_tracer("echomq")
    with tracer.start_as_current_span(
            f"{queue} process", kind=_trace.SpanKind.CONSUMER, links=links,
            attributes={"messaging.system": "echomq", "messaging.destination.name": queue,
                        "messaging.operation.type": "process", "messaging.operation.name":
                        "process", "messaging.message.id": job_id,
                        "echomq.job.name": job_name}):
        yield
