"""Tasks the failure-log and current-job tests run with ``--tasks sup_current``.

Their queue comes from SUP_CURRENT_QUEUE, so each test has its own.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import echomq

QUEUE = os.environ.get("SUP_CURRENT_QUEUE", "sup-current")


def _seen() -> dict[str, Any]:
    job = echomq.current_job()
    assert job is not None
    job.progress({"pid": os.getpid()})
    return {"id": job.id, "name": job.name, "lane": job.lane, "attempts": job.attempts}


@echomq.task(queue=QUEUE, name="cur.whoami", lane="me")
def whoami() -> dict[str, Any]:
    return _seen()


@echomq.task(queue=QUEUE, name="cur.awhoami", lane="me")
async def awhoami() -> dict[str, Any]:
    await asyncio.sleep(0)
    return _seen()


@echomq.task(queue=QUEUE, name="cur.third_time", max_attempts=5)
def third_time() -> int:
    job = echomq.current_job()
    assert job is not None
    if job.attempts < 3:
        raise echomq.Retry(delay=0.01, reason=f"not yet on attempt {job.attempts}")
    return job.attempts


@echomq.task(queue=QUEUE, name="cur.give_up", max_attempts=5)
async def give_up() -> None:
    raise echomq.Fail("not worth another try")


@echomq.task(queue=QUEUE, name="cur.flaky", max_attempts=2, backoff=0.01)
def flaky(n: int) -> None:
    raise ValueError(f"mailbox {n} is full\nthe second line stays in the traceback")


@echomq.task(queue=QUEUE, name="cur.doomed", max_attempts=1)
def doomed(n: int) -> None:
    raise KeyError(n)
