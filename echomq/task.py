"""Tasks: functions registered by name, sent as jobs, run by the supervisor's ``--tasks``.

>>> @echomq.task(queue="emails", max_attempts=5, timeout=30.0)
... def send_email(to: str, subject: str) -> dict: ...
>>> jid = send_email.send("a@b.c", subject="hi")   # payload {"args": [...], "kwargs": {...}}

Calling the function still just calls it. ``send``'s signature follows the
function's (ParamSpec), so a type checker flags a wrong call before it is sent.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from echomq import pools
from echomq.backoff import Backoff
from echomq.errors import CorruptJob, InvalidName
from echomq.job import Job
from echomq.keys import validate_name

if TYPE_CHECKING:
    from echomq.canvas import Signature

P = ParamSpec("P")
R = TypeVar("R")

LaneSpec = str | Callable[..., Any] | None

REGISTRY: dict[str, Task[Any, Any]] = {}


@dataclass(frozen=True)
class SendOptions:
    """Per-call options of :meth:`Task.options`; None means the task's (or queue's) default."""

    lane: LaneSpec = None
    delay: float | None = None
    run_at: datetime | None = None
    job_id: str | None = None
    priority: int | None = None
    timeout: float | None = None
    max_attempts: int | None = None
    dedup_s: float | None = None
    tx: Any = None  # a SQLAlchemy Connection/Session: the job goes through the outbox


class Task(Generic[P, R]):
    """A function registered under a name on a queue. See the module docstring."""

    def __init__(self, fn: Callable[P, R], *, queue: str, name: str | None = None,
                 max_attempts: int | None = None, backoff: Backoff | float | None = None,
                 timeout: float | None = None, lane: LaneSpec = None,
                 dedup_s: float | None = None, redis_url: str | None = None) -> None:
        self.fn = fn
        self.queue = validate_name(queue)
        self.name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
        if not isinstance(self.name, str) or not self.name or len(self.name) > 255:
            raise InvalidName(f"invalid task name {self.name!r}: a non-empty string of at most "
                              "255 chars")
        if max_attempts is not None and (isinstance(max_attempts, bool)
                                         or not isinstance(max_attempts, int) or max_attempts < 1):
            raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        self.max_attempts = max_attempts
        self.backoff = Backoff.coerce(backoff)
        self.timeout = _seconds("timeout", timeout)
        self.dedup_s = _seconds("dedup_s", dedup_s)
        self.lane = lane
        self.redis_url = redis_url  # None: echomq.configure(...) / ECHOMQ_REDIS_URL
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<task {self.name!r} on queue {self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    # --- producing -----------------------------------------------------------

    def send(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Admit a job running this task with these arguments; returns its id."""
        return TaskCall(self, SendOptions()).send(*args, **kwargs)

    async def asend(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """:meth:`send` from asyncio code (``echomq.aio``), on the running loop's pool."""
        return await TaskCall(self, SendOptions()).asend(*args, **kwargs)

    def options(self, *, lane: LaneSpec = None, delay: float | None = None,
                run_at: datetime | None = None, job_id: str | None = None,
                priority: int | None = None, timeout: float | None = None,
                max_attempts: int | None = None, dedup_s: float | None = None,
                tx: Any = None) -> TaskCall[P, R]:
        """Per-call overrides: ``task.options(lane="u-7", delay=60).send(...)``; ``tx=``
        a SQLAlchemy Connection/Session (or its asyncio twin, for ``asend``): the job is
        written in that transaction (the outbox, :meth:`echomq.Queue.add`)."""
        return TaskCall(self, SendOptions(lane, delay, run_at, job_id, priority, timeout,
                                          max_attempts, dedup_s, tx))

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature: this task and these arguments, for chain, group and chord."""
        from echomq.canvas import Signature

        return Signature(self, args, kwargs)

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for a sent job's return value (:meth:`echomq.Queue.result`)."""
        return pools.queue(self.queue, self.redis_url).result(job_id, timeout)

    # --- consuming -----------------------------------------------------------

    def handler(self) -> Callable[[Job], Any]:
        """The job handler that runs this task (an ``async def`` for a coroutine function)."""
        if self.is_async:
            async def run_async(job: Job) -> Any:
                args, kwargs = fed(job, *unpack(job))
                return await self.fn(*args, **kwargs)  # type: ignore[misc]

            return run_async

        def run(job: Job) -> Any:
            args, kwargs = fed(job, *unpack(job))
            return self.fn(*args, **kwargs)

        return run


class TaskCall(Generic[P, R]):
    """A task with per-call options, ready to ``send``."""

    def __init__(self, task: Task[P, R], opts: SendOptions) -> None:
        self.task = task
        self.opts = opts

    def options(self, **changes: Any) -> TaskCall[P, R]:
        """A copy of this call with some admit options changed (lane, delay, priority, ...)."""
        return TaskCall(self.task, replace(self.opts, **changes))

    def send(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Admit a job that runs the task with these arguments; returns its id."""
        queue = pools.queue(self.task.queue, self.task.redis_url)
        return queue.add(self.task.name, pack(args, kwargs), **self._add_options(args, kwargs))

    async def asend(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """`send` for asyncio code, through `echomq.aio.Queue`."""
        queue = pools.aio_queue(self.task.queue, self.task.redis_url)
        return await queue.add(self.task.name, pack(args, kwargs),
                               **self._add_options(args, kwargs))

    def _add_options(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        t, o = self.task, self.opts
        options: dict[str, Any] = {
            "lane": _lane(o.lane if o.lane is not None else t.lane, args, kwargs),
            "delay": o.delay, "run_at": o.run_at, "job_id": o.job_id,
            "max_attempts": o.max_attempts if o.max_attempts is not None else t.max_attempts,
            "backoff": t.backoff,
            "timeout": o.timeout if o.timeout is not None else t.timeout,
            "dedup_s": o.dedup_s if o.dedup_s is not None else t.dedup_s,
        }
        if o.priority is not None:
            options["priority"] = o.priority
        if o.tx is not None:
            options["tx"] = o.tx
        return options


def task(*, queue: str, name: str | None = None, max_attempts: int | None = None,
         backoff: Backoff | float | None = None, timeout: float | None = None,
         lane: LaneSpec = None, dedup_s: float | None = None,
         redis_url: str | None = None) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Register a function (sync or async) as a task; see the module docstring.

    ``lane`` is a lane name or a function of the task's arguments returning one
    (e.g. ``lane=lambda user_id, **_: f"user-{user_id}"``).
    """
    def register(fn: Callable[P, R]) -> Task[P, R]:
        made = Task(fn, queue=queue, name=name, max_attempts=max_attempts, backoff=backoff,
                    timeout=timeout, lane=lane, dedup_s=dedup_s, redis_url=redis_url)
        known = REGISTRY.get(made.name)
        if known is not None and _origin(known) != _origin(made):
            raise ValueError(f"task name {made.name!r} is already registered by "
                             f"{_origin(known)}; give one of them another name=")
        REGISTRY[made.name] = made  # the same function again (a module reload) replaces it
        return made

    return register


def tasks_on(queue: str) -> dict[str, Callable[[Job], Any]]:
    """The handlers of every registered task on ``queue``, by task name."""
    return {t.name: t.handler() for t in REGISTRY.values() if t.queue == queue}


def queues() -> list[str]:
    """Every queue some registered task names, sorted."""
    return sorted({t.queue for t in REGISTRY.values()})


def pack(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The job payload of a task call: ``{"args": [...], "kwargs": {...}}``."""
    return {"args": list(args), "kwargs": dict(kwargs)}


def unpack(job: Job) -> tuple[list[Any], dict[str, Any]]:
    """A task job's arguments; CorruptJob when the payload is not ``{"args", "kwargs"}``."""
    p = job.payload
    if (not isinstance(p, dict) or not isinstance(p.get("args", []), list)
            or not isinstance(p.get("kwargs", {}), dict)):
        raise CorruptJob(f"job {job.id!r} of task {job.name!r}: payload must be "
                         f'{{"args": [...], "kwargs": {{...}}}}, got {p!r:.200}')
    return list(p.get("args", [])), dict(p.get("kwargs", {}))


def fed(job: Job, args: list[Any], kwargs: dict[str, Any]
        ) -> tuple[list[Any], dict[str, Any]]:
    """A workflow job's arguments with what feeds it first (its payload's "feed"): the
    result of the one job it waited for, or the list of a group's results, in order."""
    feed = job.payload.get("feed") if isinstance(job.payload, dict) else None
    if feed is None:
        return args, kwargs
    values = list(job.dependency_results().values())
    return [values[0] if feed == "one" else values, *args], kwargs


def _lane(spec: LaneSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    if spec is None or isinstance(spec, str):
        return spec
    value = spec(*args, **kwargs)
    return None if value is None else str(value)


def _origin(t: Task[Any, Any]) -> str:
    return f"{t.fn.__module__}.{t.fn.__qualname__}"


def _seconds(what: str, value: float | None) -> float | None:
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{what} must be a number of seconds > 0, got {value!r}")
    return float(value)
