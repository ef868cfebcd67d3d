"""The running job in every log record: ``job_id``, ``queue``, ``lane`` and ``attempt``.

:class:`JobContextFilter` reads :func:`echomq.current_job` (a context variable, so each
thread of a pool and each asyncio task sees its own job) and sets those four attributes
on records logged while a handler runs; outside a job it sets nothing, so nothing of one
job is left on the next one's records. Attributes a record already has (``extra=``) are
kept. The supervisor puts it on its log handler; a standalone :class:`echomq.Consumer`
puts it on the root logger's handlers when it starts (:func:`install`); any other
handler takes it with ``handler.addFilter(JobContextFilter())``, and a formatter then
prints them (``%(job_id)s``; use a ``defaults=`` mapping for records logged outside a job).
"""

from __future__ import annotations

import logging

from echomq.current import CURRENT

FIELDS = ("job_id", "queue", "lane", "attempt")


class JobContextFilter(logging.Filter):
    """Adds the running job's id, queue, lane and attempt to each record; drops nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the running job's fields the record lacks; True (every record passes)."""
        job = CURRENT.get()
        if job is not None:
            values = record.__dict__
            if "job_id" not in values:
                values["job_id"] = job.id
            if "queue" not in values:
                values["queue"] = job.queue
            if "lane" not in values:
                values["lane"] = job.lane
            if "attempt" not in values:
                values["attempt"] = job.attempts
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Put one :class:`JobContextFilter` on every handler of ``logger`` (the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, JobContextFilter) for f in handler.filters):
            handler.addFilter(JobContextFilter())
