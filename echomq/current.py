"""The running job, for code that has no ``job`` argument (a task function, a helper).

A context variable set around every handler call, sync or async, standalone or under
the supervisor, one job per thread or per asyncio task with ``concurrency`` above 1.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from echomq.job import Job

# set and reset by the runner around each handler call (directly: it is on every job's path)
CURRENT: ContextVar[Job | None] = ContextVar("echomq_current_job", default=None)


def current_job() -> Job | None:
    """The :class:`Job` whose handler is running here (its id, attempts, lane,
    ``progress``); None outside a job."""
    return CURRENT.get()


def call_in_job(fn: Callable[[Job], Any], job: Job) -> Any:
    """``fn(job)`` with ``job`` current (for a sync handler in a pool thread)."""
    token = CURRENT.set(job)
    try:
        return fn(job)
    finally:
        CURRENT.reset(token)
