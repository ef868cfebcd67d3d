"""Django's database connections around each job, as Django's request cycle does for a
request: ``close_old_connections()`` before and after it, so a job never starts on a
connection the server dropped, past ``CONN_MAX_AGE``, or left broken by the last job.

``manage.py echomq_supervisor`` installs it in every consumer.
"""

from __future__ import annotations

from typing import Any

from django.db import close_old_connections

from echomq.job import Job
from echomq.middleware import Middleware


class CloseOldConnections(Middleware):
    """``django.db.close_old_connections()`` before and after each job (in the thread that
    runs it: Django's connections are per thread)."""

    def before_job(self, job: Job) -> None:
        """Drop a connection that is unusable or too old before the handler opens it."""
        close_old_connections()

    def after_job(self, job: Job, result: Any) -> None:
        """Close the job's connection when its age is up (``CONN_MAX_AGE``)."""
        close_old_connections()

    def on_failure(self, job: Job, exc: BaseException, will_retry: bool) -> None:
        """As after a success: an error's connection is checked and closed when broken."""
        close_old_connections()


TARGET = f"{__name__}:{CloseOldConnections.__name__}"  # for --middleware
