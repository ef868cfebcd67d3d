"""Report handlers' exceptions to Sentry (extra ``echomq[sentry]``).

>>> import sentry_sdk
>>> sentry_sdk.init(dsn=...)
>>> echomq.Consumer(q, handler, middleware=[SentryMiddleware()])

or ``echomq-supervisor start ... --middleware echomq.contrib.sentry:SentryMiddleware``
(``sentry_sdk.init`` then runs where the consumer imports its handler module).

Each captured event carries the tags ``echomq.queue``, ``echomq.job_id``,
``echomq.name``, ``echomq.lane`` and ``echomq.attempt``, a context ``echomq.job``
(with ``max_attempts`` and ``will_retry``), a mechanism ``echomq`` (unhandled), and
the job's trace: a job added inside a traced request (OpenTelemetry's ``traceparent``,
carried in the job) is reported under that request's trace id.

``every_attempt=True`` (the default) captures every failed attempt;
``every_attempt=False`` only the last one, when the job goes dead (no retry left,
``echomq.Fail``, or its time limit on the last attempt): one event per lost job
instead of one per retry.
"""

from __future__ import annotations

from echomq.extras import require
from echomq.job import Job
from echomq.middleware import Middleware

require("sentry", "echomq.contrib.sentry")

import sentry_sdk  # noqa: E402 - after the check that names the extra
from sentry_sdk.utils import event_from_exception  # noqa: E402


class SentryMiddleware(Middleware):
    """Captures the exception of each failed attempt (or only of the last one)."""

    def __init__(self, *, every_attempt: bool = True) -> None:
        self.every_attempt = every_attempt

    def on_failure(self, job: Job, exc: BaseException, will_retry: bool) -> None:
        """Capture ``exc`` in a scope of its own, tagged with the job, under its trace
        (nothing when no Sentry client is active, or a retry follows and only the last
        attempt is wanted)."""
        if will_retry and not self.every_attempt:
            return
        client = sentry_sdk.get_client()
        if not client.is_active():
            return
        with sentry_sdk.isolation_scope() as scope:
            if job.trace:
                sentry_trace = _sentry_trace(job.trace)
                if sentry_trace:
                    sentry_sdk.continue_trace({"sentry-trace": sentry_trace})
            scope.set_tag("echomq.queue", job.queue)
            scope.set_tag("echomq.job_id", job.id)
            scope.set_tag("echomq.name", job.name)
            scope.set_tag("echomq.lane", job.lane)
            scope.set_tag("echomq.attempt", job.attempts)
            scope.set_context("echomq.job", {
                "queue": job.queue, "id": job.id, "name": job.name, "lane": job.lane,
                "attempt": job.attempts, "max_attempts": job.max_attempts,
                "will_retry": will_retry})
            scope.transaction = f"echomq {job.queue} {job.name}"
            event, hint = event_from_exception(
                exc, client_options=client.options,
                mechanism={"type": "echomq", "handled": False})
            sentry_sdk.capture_event(event, hint=hint)


def _sentry_trace(traceparent: str) -> str:
    """A W3C ``traceparent`` as a ``sentry-trace`` header value ('' when malformed)."""
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return ""
    try:
        sampled = int(parts[3], 16) & 1
    except ValueError:
        return ""
    return f"{parts[1]}-{parts[2]}-{sampled}"

