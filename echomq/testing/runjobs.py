"""``run_jobs``: every claimable job of a queue, run now in this process, through the real
scripts (a standalone :class:`echomq.Consumer` in burst mode)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import ModuleType
from typing import Any

from echomq import pools
from echomq.consumer import Consumer
from echomq.errors import ConfigError, CorruptJob
from echomq.job import Claimed, Job
from echomq.lanes import Outcome
from echomq.queue import Queue
from echomq.runner import HandlerLike
from echomq.scripts import Settled
from echomq.task import Task, tasks_on

TaskSpec = Task[Any, Any] | str | ModuleType
STATE_OF = {"c": "completed", "d": "dead", "f": "scheduled"}


class JobsFailed(AssertionError):
    """``run_jobs(..., raise_on_failure=True)`` ran jobs whose last attempt failed."""

    def __init__(self, failed: Sequence[Job]) -> None:
        self.jobs = list(failed)
        lines = [f"{len(failed)} job(s) failed:"]
        for job in failed:
            lines.append(f"- job {job.id} {job.name!r} on queue {job.queue!r}: {job.state}, "
                         f"attempt {job.attempts} of {job.max_attempts}")
            lines.extend("    " + line for line in (job.error or "(no error text)").splitlines())
        super().__init__("\n".join(lines))


JobsFailed.__module__ = "echomq.testing"


class _Recorder(Consumer):
    """A standalone consumer that remembers each job it claimed and how each run ended."""

    def __init__(self, queue: Queue, handler: HandlerLike) -> None:
        super().__init__(queue, handler)
        self.claimed: dict[str, Claimed] = {}  # in first-claim order
        self.outcomes: dict[str, Outcome] = {}

    def batch_size(self) -> int:
        """Claim the queue's batch at once: this process dying ends the test anyway, so
        the standalone consumer's one-job claims buy nothing here."""
        return self.settings.claim_batch

    def on_start(self, claimed: Claimed, in_thread: bool = True) -> None:
        self.claimed.setdefault(claimed.id, claimed)
        super().on_start(claimed, in_thread)

    def after_settle(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        for o, code in zip(outcomes, codes, strict=True):
            if code is not Settled.STALE:
                self.outcomes[o.job_id] = o
        super().after_settle(outcomes, codes)


def run_jobs(queue: Queue | str, handler: HandlerLike | None = None,
             tasks: Iterable[TaskSpec] | None = None, *, raise_on_failure: bool = False,
             advance: float | None = None, now: datetime | None = None,
             max_rounds: int = 100) -> list[Job]:
    """Run every claimable job of ``queue`` here, synchronously, until none is left; return
    the jobs run, in the order first claimed, as they ended (state, result, error).

    ``handler``: a handler or a mapping of job name to handler; ``tasks``: ``@echomq.task``
    functions, or modules (or module names) whose tasks on this queue run. With neither,
    the tasks registered on the queue run. Both: tasks by name, the handler for the rest.
    Jobs due later (a ``delay``, a retry's backoff) run when due within ``advance`` seconds
    from now (``math.inf``: all of them) or at ``now``; their due times are moved earlier
    on the server (:func:`make_due`). Without either, only jobs due now run, and a retry
    not yet due ends the job's run in state "scheduled".
    ``raise_on_failure``: a :class:`JobsFailed` (an AssertionError) listing every job
    whose last attempt failed, with its error and traceback text.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    q = queue if isinstance(queue, Queue) else pools.queue(queue)
    shift = _shift(advance, now)
    recorder = _Recorder(q, _handler(q.name, handler, tasks))
    try:
        for _ in range(max_rounds):
            if shift:
                make_due(q, shift)
            recorder.processed = 0
            recorder.run(burst=True)
            if not recorder.processed or not shift:
                break
        else:
            raise RuntimeError(f"run_jobs: jobs still came due after {max_rounds} rounds "
                               "(a job that adds itself again?); raise max_rounds")
    finally:
        recorder.close()
    jobs = [_ended(q, c, recorder.outcomes.get(job_id)) for job_id, c in recorder.claimed.items()]
    failed = [j for j in jobs if j.state != "completed"]
    if raise_on_failure and failed:
        raise JobsFailed(failed)
    return jobs


def make_due(queue: Queue, seconds: float) -> int:
    """Move the due time of every job of ``queue`` due within ``seconds`` from now
    (``math.inf``: every scheduled job) earlier by that much, so that the next promote
    (a consumer's, a supervisor's or :func:`run_jobs`') finds them due. Returns how many
    moved. For tests: it rewrites the queue's schedule in place."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    server_s, micros = queue.redis.time()
    now_ms = int(server_s) * 1000 + int(micros) / 1000
    horizon: float | str = "+inf" if math.isinf(seconds) else now_ms + seconds * 1000
    entries: list[tuple[bytes, float]] = queue.redis.zrangebyscore(  # type: ignore[assignment]
        queue.keys.schedule, "-inf", horizon, withscores=True)
    if not entries:
        return 0
    # a job due later than now moves to now; one already due keeps its place
    moved: dict[bytes, float] = {member: min(score, now_ms) for member, score in entries}
    queue.redis.zadd(queue.keys.schedule, moved, xx=True)
    return len(moved)


def _shift(advance: float | None, now: datetime | None) -> float:
    if advance is not None and now is not None:
        raise ValueError("give advance= or now=, not both")
    if now is not None:
        if now.tzinfo is None:
            raise ValueError("now= must be an aware datetime (datetime.now(timezone.utc))")
        return max(0.0, (now - datetime.now(now.tzinfo)).total_seconds())
    if advance is None:
        return 0.0
    if isinstance(advance, bool) or not isinstance(advance, (int, float)) or not advance >= 0:
        raise ValueError(f"advance must be a number of seconds >= 0, got {advance!r}")
    return float(advance)


def _handler(queue: str, handler: HandlerLike | None,
             tasks: Iterable[TaskSpec] | None) -> HandlerLike:
    by_name: dict[str, Callable[[Job], Any]] = {}
    if tasks is not None:
        for spec in list(tasks):
            if isinstance(spec, Task):
                by_name[spec.name] = spec.handler()
            elif isinstance(spec, str | ModuleType):
                if isinstance(spec, str):
                    importlib.import_module(spec)  # registers its tasks
                by_name.update(tasks_on(queue))
            else:
                raise TypeError(f"tasks= takes tasks, modules or module names, got {spec!r}")
    elif handler is None:
        by_name = tasks_on(queue)
        if not by_name:
            raise ConfigError(f"run_jobs: no handler given and no task is registered on "
                              f"queue {queue!r}; pass handler= or tasks=")
    if handler is None:
        return by_name
    if isinstance(handler, Mapping):
        return {**handler, **by_name}
    return _WithFallback(by_name, handler) if by_name else handler


class _WithFallback(dict[str, Callable[[Job], Any]]):
    """Tasks by name; any other name goes to ``fallback`` (kept under "" too, so whoever
    looks at every handler, for an ``async def`` among them, sees it)."""

    def __init__(self, tasks: Mapping[str, Callable[[Job], Any]],
                 fallback: Callable[[Job], Any]) -> None:
        super().__init__(tasks)
        self.fallback = fallback
        self[""] = fallback

    def get(self, name: str, default: Any = None) -> Any:
        found = super().get(name)
        return found if found is not None else self.fallback


def _ended(q: Queue, claimed: Claimed, outcome: Outcome | None) -> Job:
    """The job as the server holds it now; rebuilt from its last run when retention
    dropped it already."""
    job = q.get(claimed.id)
    if job is not None:
        return job
    try:
        job = claimed.to_job(q.name)
    except CorruptJob:
        job = Job(id=claimed.id, name=claimed.name, payload=claimed.payload_text,
                  lane=claimed.lane, state="active", attempts=claimed.attempts,
                  max_attempts=claimed.max_attempts, created_ms=claimed.created_ms,
                  queue=q.name)
    job.token = None
    if outcome is not None:
        job.state = STATE_OF.get(outcome.outcome, job.state)
        if outcome.outcome != "c":
            job.error = outcome.text
    return job
