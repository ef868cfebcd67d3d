"""Run one claimed job through its handler and turn what happened into an Outcome.

A handler is sync or async. :meth:`Runner.run` calls it in the calling thread
(an awaitable it returns is awaited on the runner's own event loop);
:meth:`Runner.run_async` runs it on the caller's event loop, a sync handler in
the given thread pool. The time limit is the job's ``timeout`` or the
consumer's ``job_timeout``: an async job past it is cancelled; a sync one
cannot be interrupted in its thread, so the supervisor ends its process.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from time import perf_counter
from typing import Any, Protocol

from echomq import failures, loops
from echomq.backoff import Backoff, delay_ms
from echomq.config import QueueSettings
from echomq.control import Fail, Retry
from echomq.current import CURRENT, call_in_job
from echomq.debouncing import read_batch
from echomq.errors import CorruptJob
from echomq.job import Claimed, Job, payload_depth
from echomq.lanes import Outcome
from echomq.middleware import Hooks, hooks_of
from echomq.stopping import CANCELLED_TEXT, JobCancelled
from echomq.tracing import handler_span

MAX_ERROR_CHARS = 16_384


class Handler(Protocol):
    def __call__(self, job: Job) -> Any: ...


HandlerLike = Handler | Callable[[Job], Any] | Mapping[str, Callable[[Job], Any]]
ProgressFn = Callable[[str, str, Any], bool]
# told of every job run: the claimed job, its outcome code, when it started (perf_counter)
# and how long it took (s)
Observer = Callable[[Claimed, str, float, float], None]


def timed_out_text(timeout: float) -> str:
    """The error text a job gets when it ran past its time limit."""
    return f"timed out after {timeout:g} s"


class JobTimedOut(Exception):  # noqa: N818 - it is the outcome's name
    """The job ran past its time limit."""


class Runner:
    """Calls the handler for each job; never lets a handler's exception escape."""

    def __init__(self, queue: str, handler: HandlerLike, settings: QueueSettings,
                 progress: ProgressFn | None = None, observer: Observer | None = None,
                 middleware: Sequence[Any] = ()) -> None:
        self.queue = queue
        self.handler = handler
        # None without middleware: each job then pays one `is None` test for them
        self.hooks: Hooks | None = hooks_of(middleware)
        self.settings = settings
        self.progress = progress
        # what a job's handler may read through the Lanes whose progress this is, found
        # once here rather than for every job: its dependencies' results, a debounced batch
        lanes = getattr(progress, "__self__", None)
        self._dependency_reader = getattr(lanes, "dependency_results", None)
        self._batch_lanes = lanes if lanes is not None and hasattr(lanes, "keys") else None
        self.observer = observer
        self.rng = random.Random()
        self.avg_s = 0.0  # moving average of handler time, sizes claim batches
        self._loop: asyncio.AbstractEventLoop | None = None
        # True while run() is inside the handler (or an awaitable it returned): what an
        # interrupt may cut off; once it returned, the job is done and is settled as such
        self.in_handler = False
        self.cut = False  # set when a consumer cuts its running job off: a handler about to
        # be called is not (KeyboardInterrupt instead), so a cut between jobs is not lost

    # --- what kind of handler -------------------------------------------------------

    def has_async(self) -> bool:
        """True when any handler is an ``async def`` (it needs the consumer's event loop)."""
        fns = self.handler.values() if isinstance(self.handler, Mapping) else [self.handler]
        return any(is_async(fn) for fn in fns)

    def timeout_of(self, claimed: Claimed) -> float | None:
        """The job's own time limit, else the consumer's `job_timeout` (None: no limit)."""
        return claimed.timeout if claimed.timeout is not None else self.settings.job_timeout

    def prepare(self, claimed: Claimed) -> tuple[Job, Callable[[Job], Any]] | Outcome:
        """The job and its handler, or the dead Outcome of a job that cannot run."""
        try:
            job = claimed.to_job(self.queue)
        except CorruptJob as exc:
            return Outcome(claimed.id, claimed.token, "d", str(exc))
        fn = self._resolve(job.name)
        if fn is None:
            return Outcome(claimed.id, claimed.token, "d",
                           f"unknown handler {job.name!r} for queue {self.queue!r}")
        report = self.progress
        if report is not None:
            job_id, token = claimed.id, claimed.token
            job.bind_progress(lambda value: report(job_id, token, value))
            if self._dependency_reader is not None:
                job.bind_dependencies(self._dependency_reader)
            lanes = self._batch_lanes
            if lanes is not None:  # a debounced job's batch
                job.load_batch = lambda: read_batch(lanes.client, lanes.keys, job_id)
        if self.hooks is not None:
            fn = self.hooks.wrap(fn, is_async(fn))
        return job, fn

    # --- running --------------------------------------------------------------------

    def run(self, claimed: Claimed) -> Outcome:
        """Run one job in this thread; returns completed, failed or dead, whatever its
        payload, handler or result raise.

        The hot path of every sync drain: one clock read before and after, no context
        manager unless the job carries a trace, and an awaitable looked for only when the
        handler returned something."""
        start = perf_counter()
        entered = None
        try:
            prepared = self.prepare(claimed)
            if prepared.__class__ is Outcome:
                outcome: Outcome = prepared
            else:
                job, fn = prepared  # type: ignore[misc]
                entered = CURRENT.set(job)
                self.in_handler = True
                if self.cut:
                    raise KeyboardInterrupt
                if claimed.trace:  # a producer that was tracing: run in a span linked to it
                    with handler_span(self.queue, job.name, job.id, claimed.trace):
                        result = self._call(claimed, fn, job)
                else:
                    result = fn(job)
                    if result is not None and inspect.isawaitable(result):
                        result = self._own_loop().run_until_complete(
                            _bounded(result, self.timeout_of(claimed)))
                self.in_handler = False
                outcome = self.completed(claimed, result)
        except (Exception, asyncio.CancelledError) as exc:  # a handler failure is data, not
            # a crash (a coroutine it returned may raise CancelledError, no Exception)
            self.in_handler = False
            outcome = self.failed(claimed, exc, self.timeout_of(claimed))
            if self.hooks is not None and entered is not None and self.hooks.failure_fns:
                self._on_failure(claimed, exc, outcome)
        finally:
            self.in_handler = False
            if entered is not None:
                CURRENT.reset(entered)
        self._observe(claimed, outcome, start)
        return outcome

    def _on_failure(self, claimed: Claimed, exc: BaseException, outcome: Outcome) -> None:
        """on_failure hooks of a job run in this thread (async ones on the runner's loop)."""
        assert self.hooks is not None
        job = CURRENT.get()
        retry = will_retry(claimed, outcome)
        if any(is_async(fn) for fn in self.hooks.failure_fns):
            self._own_loop().run_until_complete(
                self.hooks.call_async(self.hooks.failure_fns, job, exc, retry))
        else:
            self.hooks.call(self.hooks.failure_fns, job, exc, retry)

    def _call(self, claimed: Claimed, fn: Callable[[Job], Any], job: Job) -> Any:
        result = fn(job)
        if inspect.isawaitable(result):
            result = self._own_loop().run_until_complete(
                _bounded(result, self.timeout_of(claimed)))
        return result

    async def run_async(self, claimed: Claimed, job: Job, fn: Callable[[Job], Any],
                        threads: Executor) -> Outcome:
        """Run one job on the running loop: a coroutine here, a sync handler in ``threads``."""
        timeout = self.timeout_of(claimed)
        loop = asyncio.get_running_loop()
        start = perf_counter()
        entered = CURRENT.set(job)  # this job's own task: its context is the job's alone
        try:
            if is_async(fn):
                result = await _bounded(fn(job), timeout)
            else:
                result = await loop.run_in_executor(threads, call_in_job, fn, job)
                if inspect.isawaitable(result):
                    result = await _bounded(result, timeout)
            outcome = self.completed(claimed, result)
        except asyncio.CancelledError as exc:
            # the drain never cancels the task a job runs in (a stop lets it finish): the
            # handler cancelled it, or raised it itself. A failure like any other; raised
            # on, the job would be neither settled nor handed back, its lease extended for
            # as long as the process lives
            task = asyncio.current_task()
            if task is not None:
                while task.uncancel():
                    pass
            outcome = self.failed(claimed, exc, timeout)
            if self.hooks is not None and self.hooks.failure_fns:
                await self.hooks.call_async(self.hooks.failure_fns, job, exc,
                                            will_retry(claimed, outcome))
        except Exception as exc:
            outcome = self.failed(claimed, exc, timeout)
            if self.hooks is not None and self.hooks.failure_fns:
                await self.hooks.call_async(self.hooks.failure_fns, job, exc,
                                            will_retry(claimed, outcome))
        finally:
            CURRENT.reset(entered)
        self._observe(claimed, outcome, start)
        return outcome

    # --- outcomes -------------------------------------------------------------------

    def completed(self, claimed: Claimed, result: Any) -> Outcome:
        """The outcome of a job whose handler returned ``result``."""
        return Outcome(claimed.id, claimed.token, "c", self._encode_result(result))

    def failed(self, claimed: Claimed, exc: BaseException, timeout: float | None) -> Outcome:
        """Retry (by backoff, or after Retry's delay), or dead at once for Fail."""
        if isinstance(exc, JobCancelled) or (isinstance(exc, asyncio.CancelledError)
                                             and exc.args[:1] == (CANCELLED_TEXT,)):
            # recorded "cancelled" already (stop.lua): this outcome is refused
            return Outcome(claimed.id, claimed.token, "d", str(exc))
        failures.note(self.queue, claimed, exc)
        if isinstance(exc, JobTimedOut):
            return Outcome(claimed.id, claimed.token, "f", timed_out_text(timeout or 0),
                           self.retry_ms(claimed))
        text = "".join(traceback.format_exception(exc))[-MAX_ERROR_CHARS:]
        if isinstance(exc, Fail):
            return Outcome(claimed.id, claimed.token, "d", text)
        if isinstance(exc, Retry):
            return Outcome(claimed.id, claimed.token, "f", text, delay_ms(exc.delay))
        return Outcome(claimed.id, claimed.token, "f", text, self.retry_ms(claimed))

    def retry_ms(self, claimed: Claimed) -> int:
        """How long until the job's next attempt, from its (or the queue's) backoff."""
        return retry_ms_of(self.settings, claimed.attempts, claimed.backoff, self.rng)

    def batch_size(self, flush_window_s: float = 0.01) -> int:
        """How many jobs to claim at once: a full batch for fast handlers, one for slow ones."""
        if self.avg_s <= 0:
            return 1
        return max(1, min(self.settings.claim_batch, int(flush_window_s / self.avg_s)))

    def close(self) -> None:
        """Close the event loop that runs async handlers, if one was made."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = loops.new_event_loop()
        return self._loop

    def _observe(self, claimed: Claimed, outcome: Outcome, start: float) -> None:
        """Fold the job's run time into the batch sizing average and tell the observer."""
        elapsed = perf_counter() - start
        self.avg_s = elapsed if self.avg_s == 0 else 0.8 * self.avg_s + 0.2 * elapsed
        if self.observer is not None:
            self.observer(claimed, outcome.outcome, start, elapsed)

    def _resolve(self, name: str) -> Callable[[Job], Any] | None:
        if isinstance(self.handler, Mapping):
            return self.handler.get(name)
        return self.handler

    def _encode_result(self, result: Any) -> str:
        """The result as JSON (its repr, when it is not JSON); a note instead when it is
        past the payload limits, so that whoever reads it can decode it, or when its repr
        raises (the handler's work is done: failing the job would run it again)."""
        if result is None:
            return ""
        try:
            try:
                text = json.dumps(result, separators=(",", ":"), ensure_ascii=False,
                                  allow_nan=False)
            except (TypeError, ValueError):
                text = json.dumps(repr(result))
        except RecursionError:  # nested deeper than the encoder (or repr) goes
            return self._too_deep_note()
        except Exception as exc:  # noqa: BLE001 - its repr raised: the job is done all the same
            return json.dumps(f"<result of type {type(result).__name__} not kept: its repr "
                              f"raised {type(exc).__name__}>")
        if len(text) > self.settings.max_payload_bytes:
            return json.dumps(f"<result of {len(text)} bytes not kept>")
        depth = self.settings.max_payload_depth
        if text.count("[") + text.count("{") > depth and payload_depth(
                text.encode(errors="surrogatepass")) > depth:  # a lone surrogate is kept as is
            return self._too_deep_note()
        return text

    def _too_deep_note(self) -> str:
        return json.dumps(f"<result nested deeper than {self.settings.max_payload_depth} "
                          "levels not kept>")


def retry_ms_of(settings: QueueSettings, attempts: int, backoff_text: str,
                rng: random.Random | None = None) -> int:
    """Milliseconds before the retry of failed attempt ``attempts``: the job's own backoff
    (its encoded text, when valid) or the queue's; whole ms, at most 100 years."""
    backoff = Backoff.decode(backoff_text) if backoff_text else None
    return delay_ms((backoff or settings.backoff).delay(attempts, rng))


def will_retry(claimed: Claimed, outcome: Outcome) -> bool:
    """Whether settle gives a failed job another attempt (as settle.lua decides it)."""
    return outcome.outcome == "f" and claimed.attempts < claimed.max_attempts


def is_async(fn: Any) -> bool:
    """An ``async def`` function (or a callable object whose ``__call__`` is one)."""
    call = type(fn).__call__ if not inspect.isfunction(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


async def _bounded(awaitable: Awaitable[Any], timeout: float | None) -> Any:
    """Await within the time limit; our own limit raises JobTimedOut (a TimeoutError the
    handler raised itself stays a plain failure)."""
    if timeout is None:
        return await awaitable
    try:
        async with asyncio.timeout(timeout) as scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            raise JobTimedOut(timed_out_text(timeout)) from None
        raise

