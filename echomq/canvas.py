"""Workflows over tasks: signatures, chains, groups and chords.

>>> wf = echomq.chain(fetch.s(url), parse.s(), store.s()).send()   # each result is the
>>> wf.result(timeout=30)                                           # next one's first argument
>>> echomq.chord(echomq.group(resize.s(i) for i in ids), combine.s()).send()

A workflow is built into jobs with dependencies (``after=``, see :mod:`echomq.depend`)
and admitted in one round trip per queue, every job ``blocked`` until what it waits
for completed. A job fed by one job gets that result as its first argument; one fed
by a group (a chord's callback) gets the list of the group's results, in the group's
order. Jobs waiting for each other must share a queue. See docs/workflows.md.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from echomq import depend, pools
from echomq.admit import Spec
from echomq.task import REGISTRY, SendOptions, Task, TaskCall, pack
from echomq.tracing import producer_span

MAX_WORKFLOW_JOBS = 50_000  # jobs of one workflow
COLLECT_NAME = "echomq.workflow.result"  # a group's result record: never runs


@dataclass(frozen=True)
class Signature:
    """A task and the arguments of one call of it: ``task.s(*args, **kwargs)``."""

    task: Task[Any, Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    opts: SendOptions = SendOptions()

    def set(self, **options: Any) -> Signature:
        """A copy with per-call options (lane, priority, timeout, max_attempts, job_id...)."""
        return Signature(self.task, self.args, self.kwargs, _replace(self.opts, options))

    def send(self) -> Workflow:
        """Admit this one job as a workflow of one."""
        return chain(self).send()

    async def asend(self) -> Workflow:
        """:meth:`send` from asyncio code."""
        return await chain(self).asend()


def signature(name: str, *args: Any, **kwargs: Any) -> Signature:
    """A signature of a task registered under ``name``; LookupError when none is."""
    found = REGISTRY.get(name)
    if found is None:
        raise LookupError(f"unknown task {name!r}: no @echomq.task registered under this name")
    return Signature(found, args, kwargs)


class Canvas:
    """What chain, group and chord share: building jobs and sending them."""

    def send(self) -> Workflow:
        """Admit every job of the workflow (one round trip per queue); the Workflow. The
        admit runs in one PRODUCER span ("workflow", the job count) every job carries."""
        with producer_span(_first_queue(self), "workflow") as span:
            plan = _plan(self)
            _note_plan(span, plan)
            for queue, specs, deps in plan.batches():
                queue.add_blocked(specs, deps)
        return plan.workflow()

    async def asend(self) -> Workflow:
        """:meth:`send` from asyncio code, through :class:`echomq.aio.Queue`."""
        with producer_span(_first_queue(self), "workflow") as span:
            plan = _plan(self)
            _note_plan(span, plan)
            for queue, specs, deps in plan.batches():
                await pools.aio_queue(queue.name, plan.urls[queue.name]).add_blocked(specs,
                                                                                    deps)
        return plan.workflow()


def _first_queue(item: Signature | Canvas) -> str:
    """The queue of a workflow's first job (its span's destination)."""
    while not isinstance(item, Signature):
        item = item.header if isinstance(item, chord) else item.items[0]
    return item.task.queue


def _note_plan(span: Any, plan: _Plan) -> None:
    """The workflow's id and job count on its producer span."""
    if span is not None and span.is_recording():
        span.set_attribute("messaging.batch.message_count", len(plan.jobs))
        span.set_attribute("echomq.workflow.id", plan.id)


class chain(Canvas):  # noqa: N801 - named like the function a Celery user calls
    """Run one after another; each result is the next one's first argument."""

    def __init__(self, *items: Signature | Canvas) -> None:
        if not items:
            raise ValueError("an empty chain: give it at least one signature")
        self.items = [_checked(i) for i in items]


class group(Canvas):  # noqa: N801
    """Run all at once; its result is the list of its members' results, in order."""

    def __init__(self, *items: Signature | Canvas | Iterable[Signature | Canvas]) -> None:
        if len(items) == 1 and not isinstance(items[0], (Signature, Canvas)):
            items = tuple(items[0])  # group(sig for ...) or group([...])
        if not items:
            raise ValueError("an empty group: give it at least one signature")
        self.items = [_checked(i) for i in items]


class chord(Canvas):  # noqa: N801
    """A group, then ``callback`` once with the list of the group's results."""

    def __init__(self, header: group | Iterable[Signature | Canvas],
                 callback: Signature | Canvas) -> None:
        self.header = header if isinstance(header, group) else group(header)
        self.callback = _checked(callback)


class Workflow:
    """A sent workflow: ``id``, ``job_ids`` (every job, in admission order), ``result()``
    (the last job's result; for a group, the list) and ``cancel()``."""

    def __init__(self, workflow_id: str, jobs: Sequence[tuple[str, str, str | None]],
                 outputs: Sequence[str], is_list: bool,
                 collectors: Sequence[tuple[str, str, str | None, list[str]]] = ()) -> None:
        self.id = workflow_id
        self.job_ids = [j[0] for j in jobs]
        # (job id, queue, redis url); the result records last, so cancel() takes them first
        self._jobs = [*jobs, *((c[0], c[1], c[2]) for c in collectors)]
        self._outputs = list(outputs)
        self._is_list = is_list
        self._where = {j[0]: (j[1], j[2]) for j in self._jobs}
        self._collect = [(c[0], c[3]) for c in collectors]  # a group's: (record, its outputs)

    def __repr__(self) -> str:
        return f"Workflow({self.id!r}, {len(self.job_ids)} jobs)"

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the workflow's result; JobFailed when a job it needs died, TimeoutError
        when ``timeout`` seconds pass first."""
        end = None if timeout is None else time.monotonic() + timeout
        values = []
        for jid in self._reads():
            queue, url = self._where[jid]
            left = None if end is None else max(0.0, end - time.monotonic())
            values.append(pools.queue(queue, url).result(jid, left))
        return self._value(values)

    def _reads(self) -> list[str]:
        """The records holding the result: a group's result records, else the outputs."""
        return [c[0] for c in self._collect] if self._collect else self._outputs

    def _value(self, values: list[Any]) -> Any:
        if not self._collect:
            return values if self._is_list else values[0]
        got: dict[str, Any] = {}
        for (_, outs), listed in zip(self._collect, values, strict=True):
            got.update(zip(outs, listed, strict=True))
        return [got[o] for o in self._outputs]

    async def aresult(self, timeout: float | None = None) -> Any:
        """:meth:`result` from asyncio code."""
        end = None if timeout is None else time.monotonic() + timeout
        values = []
        for jid in self._reads():
            queue, url = self._where[jid]
            left = None if end is None else max(0.0, end - time.monotonic())
            values.append(await pools.aio_queue(queue, url).result(jid, left))
        return self._value(values)

    def cancel(self) -> int:
        """Cancel every job of the workflow that has not finished, last ones first (so each
        ends cancelled, not dead for a cancelled dependency); a running one is stopped as
        :meth:`echomq.Queue.cancel` stops it. How many were cancelled."""
        return sum(pools.queue(q, url).cancel(jid) for jid, q, url in reversed(self._jobs))

    async def acancel(self) -> int:
        """:meth:`cancel` from asyncio code."""
        done = 0
        for jid, q, url in reversed(self._jobs):
            done += await pools.aio_queue(q, url).cancel(jid)
        return done


# --- building --------------------------------------------------------------------------

@dataclass
class _Job:
    sig: Signature
    job_id: str
    after: list[str]
    feed: str | None  # "one": the one input's result first; "list": the inputs' results


class _Plan:
    """The jobs of one workflow, in an order where every job follows what it waits for."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.jobs: list[_Job] = []
        self.outputs: list[str] = []
        self.is_list = False
        self.urls: dict[str, str | None] = {}
        self.ids: set[str] = set()
        # a group's result records, one per queue of its outputs: (id, queue, url, outputs)
        self.collectors: list[tuple[str, str, str | None, list[str]]] = []

    def collect(self) -> None:
        """A list result gets result records: blocked until every output completed, then
        completed with the list of their results (kept by retention from there)."""
        where = {j.job_id: (j.sig.task.queue, j.sig.task.redis_url) for j in self.jobs}
        parts: dict[tuple[str, str | None], list[str]] = {}
        for out in self.outputs:
            parts.setdefault(where[out], []).append(out)
        for n, ((queue, url), outs) in enumerate(parts.items()):
            jid = f"{self.id}.result" + (str(n) if n else "")
            if len(outs) > depend.MAX_DEPENDENCIES:
                raise ValueError(f"a group's result may gather at most "
                                 f"{depend.MAX_DEPENDENCIES:,} members, got {len(outs):,}")
            self.collectors.append((jid, queue, url, outs))

    def add(self, sig: Signature, inputs: list[str], feed: str | None) -> str:
        if len(self.jobs) >= MAX_WORKFLOW_JOBS:
            raise ValueError(f"a workflow holds at most {MAX_WORKFLOW_JOBS:,} jobs")
        if len(inputs) > depend.MAX_DEPENDENCIES:  # a chord's callback waits for each member
            raise ValueError(f"a job may wait for at most {depend.MAX_DEPENDENCIES:,} "
                             f"dependencies, got {len(inputs):,} (a chord of that many members)")
        jid = sig.opts.job_id or f"{self.id}.{len(self.jobs)}"
        if jid in self.ids:  # one end, counted once, could not release two waits for it
            raise ValueError(f"job id {jid!r} is given to two jobs of one workflow")
        self.ids.add(jid)
        self.jobs.append(_Job(sig, jid, list(inputs), feed if inputs else None))
        return jid

    def batches(self) -> list[tuple[Any, list[Spec], list[tuple[list[str], str] | None]]]:
        """Per queue: (Queue, specs, dependencies), every spec validated before any is sent."""
        by_queue: dict[tuple[str, str | None], tuple[Any, list[Spec], list[Any]]] = {}
        queue_of: dict[str, str] = {}
        for job in self.jobs:
            t = job.sig.task
            queue_of[job.job_id] = t.queue
            for dep in job.after:
                if queue_of[dep] != t.queue:
                    raise ValueError(f"task {t.name!r} on queue {t.queue!r} cannot wait for a "
                                     f"job on queue {queue_of[dep]!r}: jobs that wait for each "
                                     "other share a queue")
            key = (t.queue, t.redis_url)
            if key not in by_queue:
                by_queue[key] = (pools.queue(t.queue, t.redis_url), [], [])
                self.urls[t.queue] = t.redis_url
            q, specs, deps = by_queue[key]
            call = TaskCall(t, _replace(job.sig.opts, {"job_id": job.job_id}))
            opts = call._add_options(job.sig.args, job.sig.kwargs)
            payload = pack(job.sig.args, job.sig.kwargs)
            if job.feed:
                payload["feed"] = job.feed
            specs.append(q.planner.spec(t.name, payload, opts["lane"], opts["delay"],
                                        opts["run_at"], opts["job_id"], opts["max_attempts"],
                                        opts["backoff"], opts["timeout"], opts["dedup_s"],
                                        opts.get("priority", 0)))
            deps.append((job.after, "fail"))
        for jid, queue, url, outs in self.collectors:
            q, specs, deps = by_queue[(queue, url)]
            specs.append(q.planner.spec(COLLECT_NAME, None, None, None, None, jid, 1, None))
            deps.append((outs, "collect"))
        return list(by_queue.values())

    def workflow(self) -> Workflow:
        return Workflow(self.id, [(j.job_id, j.sig.task.queue, j.sig.task.redis_url)
                                  for j in self.jobs], self.outputs, self.is_list,
                        self.collectors)


def _plan(canvas: Canvas) -> _Plan:
    plan = _Plan()
    outputs, is_list = _build(plan, canvas, [], None)
    plan.outputs, plan.is_list = outputs, is_list
    if is_list:
        plan.collect()
    return plan


def _build(plan: _Plan, item: Signature | Canvas, inputs: list[str], feed: str | None
           ) -> tuple[list[str], bool]:
    """Add ``item``'s jobs, fed by ``inputs``; its outputs and whether they form a list."""
    if isinstance(item, Signature):
        return [plan.add(item, inputs, feed)], False
    if isinstance(item, chain):
        outs, is_list = inputs, feed == "list"
        for step in item.items:
            outs, is_list = _build(plan, step, outs, "list" if is_list else "one")
        return outs, is_list
    if isinstance(item, group):
        outs = []
        for member in item.items:
            outs += _build(plan, member, inputs, feed)[0]  # a group in a group: flattened
        return outs, True
    if isinstance(item, chord):
        header = _build(plan, item.header, inputs, feed)[0]
        return _build(plan, item.callback, header, "list")
    raise TypeError(f"not a signature, chain, group or chord: {item!r:.100}")


def _checked(item: Any) -> Signature | Canvas:
    if isinstance(item, (Signature, Canvas)):
        return item
    hint = " (use task.s(...) for a signature)" if isinstance(item, Task) else ""
    raise TypeError(f"a workflow takes signatures, chains, groups and chords, got "
                    f"{item!r:.100}{hint}")


def _replace(opts: SendOptions, changes: dict[str, Any]) -> SendOptions:
    return replace(opts, **changes)


__all__ = ["MAX_WORKFLOW_JOBS", "Signature", "Workflow", "chain", "chord", "group",
           "signature"]
