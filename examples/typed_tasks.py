"""A small typed module of tasks; ``mypy --strict examples/typed_tasks.py`` passes.

``send`` takes exactly the function's parameters, so a wrong call is a type error
before anything is sent. Run the tasks with ``echomq-supervisor start --tasks
examples.typed_tasks``.
"""

from __future__ import annotations

import echomq


@echomq.task(queue="emails", max_attempts=5, backoff=2.0, timeout=30.0)
def send_email(to: str, subject: str, *, urgent: bool = False) -> dict[str, str]:
    return {"to": to, "subject": subject, "priority": "high" if urgent else "normal"}


@echomq.task(queue="reports", lane=lambda user_id, month: f"user-{user_id}", dedup_s=3600)
async def build_report(user_id: int, month: str) -> str:
    return f"report for {user_id} in {month}"


def enqueue() -> list[str]:
    """Producer side: ids of the admitted jobs."""
    first: str = send_email.send("a@b.c", subject="hi")
    second: str = send_email.options(lane="user-7", delay=60, job_id="mail-7").send(
        "a@b.c", "hi", urgent=True)
    direct: dict[str, str] = send_email("a@b.c", "called directly, not sent")
    assert direct["to"] == "a@b.c"
    return [first, second]


async def enqueue_async() -> str:
    """From asyncio code (FastAPI and the like)."""
    return await build_report.asend(7, month="2026-11")


def wait_for(job_id: str) -> object:
    """The handler's return value, once the job completed."""
    return send_email.result(job_id, timeout=5.0)
