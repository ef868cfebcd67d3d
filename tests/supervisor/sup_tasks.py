"""Tasks the supervisor tests run with ``--tasks sup_tasks``.

Their queues come from SUP_TASKS_QUEUE and SUP_TASKS_QUEUE2, so each test has its own.
"""

from __future__ import annotations

import asyncio
import os
import time

import echomq

QUEUE = os.environ.get("SUP_TASKS_QUEUE", "sup-tasks")
QUEUE2 = os.environ.get("SUP_TASKS_QUEUE2", "sup-tasks-2")


@echomq.task(queue=QUEUE, name="sup.add")
def add(a: int, b: int = 0) -> int:
    return a + b


@echomq.task(queue=QUEUE, name="sup.third_time_lucky", max_attempts=3, backoff=0.01)
def third_time_lucky(key: str) -> str:
    attempt = int(echomq.Queue(QUEUE, redis_url=os.environ["ECHOMQ_TEST_LEDGER_URL"])
                  .redis.incr(f"ledger:{QUEUE}:{key}"))
    if attempt < 3:
        raise RuntimeError(f"attempt {attempt} fails")
    return f"ok on attempt {attempt}"


@echomq.task(queue=QUEUE, name="sup.always_fails", max_attempts=2, backoff=0.01)
def always_fails() -> None:
    raise ValueError("no such mailbox")


@echomq.task(queue=QUEUE, name="sup.slow", timeout=0.3, max_attempts=1)
def slow(seconds: float) -> str:
    time.sleep(seconds)  # simulated work that outlives the task's timeout
    return "finished"


@echomq.task(queue=QUEUE, name="sup.async_double")
async def async_double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


@echomq.task(queue=QUEUE2, name="sup.where")
def where() -> str:
    return QUEUE2
