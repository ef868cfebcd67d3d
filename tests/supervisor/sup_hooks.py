"""Middleware and handlers for the supervisor's hook and log-context tests (run in forked
consumers; evidence goes to lists ``hooks:<queue>`` on ECHOMQ_TEST_LEDGER_URL)."""

from __future__ import annotations

import asyncio
import logging
import os

import redis

import echomq

_client: redis.Redis | None = None
_pid = 0
app_log = logging.getLogger("app.jobs")


def _ledger() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client = redis.Redis.from_url(os.environ["ECHOMQ_TEST_LEDGER_URL"])
        _pid = os.getpid()
    return _client


class Ledger(echomq.Middleware):
    """Built once per consumer process: its pid is recorded with each hook call."""

    def __init__(self) -> None:
        self.built_in = os.getpid()

    def _note(self, job: echomq.Job, what: str) -> None:
        _ledger().rpush(f"hooks:{job.queue}", f"{what}:{job.id}:{self.built_in}:{os.getpid()}")

    def before_job(self, job: echomq.Job) -> None:
        self._note(job, "before")

    def after_job(self, job: echomq.Job, result: object) -> None:
        self._note(job, f"after={result}")

    def on_failure(self, job: echomq.Job, exc: BaseException, will_retry: bool) -> None:
        self._note(job, f"failure={type(exc).__name__},{will_retry}")


class AsyncLedger(Ledger):
    async def before_job(self, job: echomq.Job) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self._note(job, "before")


class Broken(echomq.Middleware):
    def before_job(self, job: echomq.Job) -> None:
        raise RuntimeError("hook broke")

    def after_job(self, job: echomq.Job, result: object) -> None:
        raise RuntimeError("hook broke")


def work(job: echomq.Job) -> str:
    app_log.info("working on %s", job.payload.get("n"))
    if job.payload.get("fail"):
        raise ValueError("boom")
    return "ok"


async def work_async(job: echomq.Job) -> str:
    await asyncio.sleep(0)
    return work(job)
