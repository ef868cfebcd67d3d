"""Run one claimed job through its handler and turn what happened into an Outcome."""

from __future__ import annotations

import json
import random
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from echomq.backoff import Backoff
from echomq.config import QueueSettings
from echomq.errors import CorruptJob
from echomq.job import Claimed, Job
from echomq.lanes import Outcome
from echomq.tracing import handler_span

MAX_ERROR_CHARS = 16_384


class Handler(Protocol):
    def __call__(self, job: Job) -> Any: ...


HandlerLike = Handler | Callable[[Job], Any] | Mapping[str, Callable[[Job], Any]]


class Runner:
    """Calls the handler for each job; never lets a handler's exception escape."""

    def __init__(self, queue: str, handler: HandlerLike, settings: QueueSettings) -> None:
        self.queue = queue
        self.handler = handler
        self.settings = settings
        self.rng = random.Random()
        self.avg_s = 0.0  # moving average of handler time, sizes claim batches

    def run(self, claimed: Claimed) -> Outcome:
        """Run one job; returns completed, failed (retry or dead by attempts) or dead."""
        try:
            job = claimed.to_job(self.queue)
        except CorruptJob as exc:
            return Outcome(claimed.id, claimed.token, "d", str(exc))
        fn = self._resolve(job.name)
        if fn is None:
            return Outcome(claimed.id, claimed.token, "d",
                           f"unknown handler {job.name!r} for queue {self.queue!r}")
        start = time.perf_counter()
        try:
            if claimed.trace:  # the producer was tracing: run in a span linked to its context
                with handler_span(self.queue, job.name, job.id, claimed.trace):
                    result = fn(job)
            else:
                result = fn(job)
        except Exception as exc:  # a handler failure is data, not a crash
            self._observe(start)
            text = "".join(traceback.format_exception(exc))[-MAX_ERROR_CHARS:]
            return Outcome(claimed.id, claimed.token, "f", text, self._retry_ms(claimed))
        self._observe(start)
        return Outcome(claimed.id, claimed.token, "c", self._encode_result(result))

    def batch_size(self, flush_window_s: float = 0.01) -> int:
        """How many jobs to claim at once: a full batch for fast handlers, one for slow ones."""
        if self.avg_s <= 0:
            return 1
        return max(1, min(self.settings.claim_batch, int(flush_window_s / self.avg_s)))

    def _observe(self, start: float) -> None:
        elapsed = time.perf_counter() - start
        self.avg_s = elapsed if self.avg_s == 0 else 0.8 * self.avg_s + 0.2 * elapsed

    def _resolve(self, name: str) -> Callable[[Job], Any] | None:
        if isinstance(self.handler, Mapping):
            return self.handler.get(name)
        return self.handler

    def _retry_ms(self, claimed: Claimed) -> int:
        backoff = Backoff.decode(claimed.backoff) if claimed.backoff else None
        delay = (backoff or self.settings.backoff).delay(claimed.attempts, self.rng)
        return int(delay * 1000)

    def _encode_result(self, result: Any) -> str:
        if result is None:
            return ""
        try:
            text = json.dumps(result, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            text = json.dumps(repr(result))
        if len(text) > self.settings.max_payload_bytes:
            return json.dumps(f"<result of {len(text)} bytes not kept>")
        return text
