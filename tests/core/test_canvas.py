"""Canvas: signatures, chain, group, chord, nesting, Workflow; one round trip per queue;
bad input admits nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import echomq
from echomq import canvas
from echomq.errors import PayloadError
from echomq.task import tasks_on


@pytest.fixture
def configured(redis_url: str) -> Iterator[str]:
    echomq.configure(redis_url=redis_url)
    yield redis_url
    echomq.configure(redis_url=None)


@pytest.fixture
def consume(configured: str) -> Iterator[Any]:
    running: list[echomq.Consumer] = []

    def start(queue: str) -> None:
        c = echomq.Consumer(queue, tasks_on(queue), redis_url=configured, beat_ms=60_000)
        threading.Thread(target=c.run, daemon=True).start()
        running.append(c)

    yield start
    for c in running:
        c.stop()


@pytest.fixture
def tasks(queue_name: str) -> Any:
    class T:
        @staticmethod
        @echomq.task(queue=queue_name, name=f"{queue_name}.add")
        def add(x: int, y: int = 0) -> int:
            return x + y

        @staticmethod
        @echomq.task(queue=queue_name, name=f"{queue_name}.mul")
        def mul(x: int, y: int) -> int:
            return x * y

        @staticmethod
        @echomq.task(queue=queue_name, name=f"{queue_name}.total")
        def total(values: list[int], extra: int = 0) -> int:
            return sum(values) + extra

        @staticmethod
        @echomq.task(queue=queue_name, name=f"{queue_name}.boom", max_attempts=1)
        def boom(*_: Any) -> None:
            raise RuntimeError("boom")

    return T


def test_chain_feeds_each_result_forward(tasks: Any, consume: Any, queue_name: str) -> None:
    wf = echomq.chain(tasks.add.s(1, 2), tasks.mul.s(10), tasks.add.s(y=5)).send()
    assert isinstance(wf, echomq.Workflow) and len(wf.job_ids) == 3
    q = echomq.Queue(queue_name)
    assert [q.get(j).state for j in wf.job_ids] == ["waiting", "blocked", "blocked"]
    consume(queue_name)
    assert wf.result(timeout=10) == (1 + 2) * 10 + 5


def test_group_result_is_the_list_in_order(tasks: Any, consume: Any, queue_name: str) -> None:
    wf = echomq.group(tasks.add.s(i, i) for i in range(6)).send()
    consume(queue_name)
    assert wf.result(timeout=10) == [0, 2, 4, 6, 8, 10]


def test_chord_callback_gets_results_in_group_order(tasks: Any, consume: Any,
                                                    queue_name: str) -> None:
    wf = echomq.chord(echomq.group(tasks.mul.s(i, 3) for i in range(5)),
                      tasks.total.s(extra=100)).send()
    q = echomq.Queue(queue_name)
    callback = q.get(wf.job_ids[-1])
    assert callback.state == "blocked" and callback.after == tuple(wf.job_ids[:-1])
    consume(queue_name)
    assert wf.result(timeout=10) == 0 + 3 + 6 + 9 + 12 + 100


def test_nesting_chain_of_groups_and_chord_in_chain(tasks: Any, consume: Any,
                                                    queue_name: str) -> None:
    # 2 -> [2+1, 2+2] -> total 7 -> chord([7*1, 7*2]) -> total 21 -> +1
    wf = echomq.chain(
        tasks.add.s(1, 1),
        echomq.group(tasks.add.s(1), tasks.add.s(2)),
        tasks.total.s(),
        echomq.chord([tasks.mul.s(1), tasks.mul.s(2)], tasks.total.s()),
        tasks.add.s(1),
    ).send()
    assert len(wf.job_ids) == 8
    consume(queue_name)
    assert wf.result(timeout=10) == 22


def test_one_round_trip_per_queue(tasks: Any, configured: str, queue_name: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from echomq import queue as queue_module

    pipelines: list[tuple[str, int]] = []

    def spy(name: str) -> Any:  # counts pipelines, runs the real one
        real = getattr(queue_module.scripts, name)

        def run(client: Any, calls: Any) -> Any:
            pipelines.append((name, len(calls)))
            return real(client, calls)
        return run

    for name in ("execute", "execute_atomically"):
        monkeypatch.setattr(queue_module.scripts, name, spy(name))
    wf = echomq.chord(echomq.group(tasks.add.s(i) for i in range(1200)), tasks.total.s()).send()
    # 1201 jobs: one MULTI/EXEC pipeline of three block.lua calls
    assert pipelines == [("execute_atomically", 3)]
    q = echomq.Queue(queue_name)
    assert q.counts()["blocked"] == 1 and q.counts()["waiting"] == 1200
    assert q.get(wf.job_ids[-1]).after == tuple(wf.job_ids[:-1])


def test_a_dead_member_ends_the_callback(tasks: Any, consume: Any, queue_name: str) -> None:
    wf = echomq.chord([tasks.add.s(1), tasks.boom.s()], tasks.total.s()).send()
    consume(queue_name)
    with pytest.raises(echomq.JobFailed):
        wf.result(timeout=10)
    q = echomq.Queue(queue_name)
    assert q.get(wf.job_ids[-1]).error == f"dependency {wf.job_ids[1]} dead"


def test_cancel_cancels_what_has_not_run(tasks: Any, configured: str, queue_name: str) -> None:
    wf = echomq.chain(tasks.add.s(1), tasks.add.s(2), tasks.add.s(3)).send()
    assert wf.cancel() == 3
    q = echomq.Queue(queue_name)
    assert [q.get(j).state for j in wf.job_ids] == ["cancelled"] * 3
    assert q.counts()["blocked"] == 0 and q.counts()["waiting"] == 0


def test_asyncio_send_result_cancel(tasks: Any, consume: Any, queue_name: str) -> None:
    consume(queue_name)

    async def main() -> tuple[Any, int]:
        wf = await echomq.chain(tasks.add.s(2, 3), tasks.mul.s(4)).asend()
        value = await wf.aresult(timeout=10)
        later = await echomq.chain(tasks.add.s(1).set(delay=None), tasks.add.s(1)).asend()
        return value, len(later.job_ids)

    assert asyncio.run(main()) == (20, 2)


@pytest.mark.parametrize("build, error", [
    (lambda t: echomq.group(), ValueError),
    (lambda t: echomq.group([]), ValueError),
    (lambda t: echomq.chain(), ValueError),
    (lambda t: echomq.chain(t.add), TypeError),
    (lambda t: echomq.chain(t.add.s(1), lambda x: x), TypeError),
    (lambda t: echomq.chain(t.add.s(1), t.add.s(object())), PayloadError),
    (lambda t: echomq.chain(t.add.s(1), t.add.s(1).set(delay=5)), ValueError),
])
def test_bad_workflows_admit_nothing(tasks: Any, configured: str, queue_name: str,
                                     build: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        build(tasks).send()
    assert sum(echomq.Queue(queue_name).counts().values()) == 0


def test_unknown_task_and_too_many_jobs(tasks: Any, configured: str, queue_name: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LookupError, match="unknown task"):
        echomq.signature("no.such.task", 1)
    assert echomq.signature(f"{queue_name}.add", 1).task is tasks.add
    monkeypatch.setattr(canvas, "MAX_WORKFLOW_JOBS", 5)
    with pytest.raises(ValueError, match="at most 5"):
        echomq.group(tasks.add.s(i) for i in range(6)).send()
    assert sum(echomq.Queue(queue_name).counts().values()) == 0


def test_jobs_waiting_across_queues_are_refused(tasks: Any, configured: str,
                                                queue_name: str) -> None:
    @echomq.task(queue=f"{queue_name}-other", name=f"{queue_name}.elsewhere")
    def elsewhere(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="share a queue"):
        echomq.chain(tasks.add.s(1), elsewhere.s()).send()
    assert sum(echomq.Queue(queue_name).counts().values()) == 0
    wf = echomq.group(tasks.add.s(1), elsewhere.s(2)).send()  # no waiting: allowed
    assert echomq.Queue(f"{queue_name}-other").get(wf.job_ids[1]).state == "waiting"


def test_a_workflow_in_several_calls_is_admitted_whole_before_any_member_can_run(
        tasks: Any, configured: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,201 jobs take three block.lua calls. Between the calls of a plain pipeline the
    # server serves other clients: a consumer could run the members of the first call
    # and retention drop their records before the callback naming them is admitted, which
    # would then read their results as null. The hook runs such a consumer between the
    # calls wherever they are sent one pipeline command after another.
    from echomq import queue as queue_module

    real = queue_module.scripts.execute
    interleaved: list[int] = []

    def one_by_one(client: Any, calls: Any) -> Any:
        if any(script is not queue_module.scripts.BLOCK for script, _, _ in calls):
            return real(client, calls)  # a consumer's own calls
        out = []
        for i, call in enumerate(calls):
            if i:
                interleaved.append(echomq.Consumer(
                    queue_name, tasks_on(queue_name), redis_url=configured,
                    keep_completed=10).run(burst=True))
            out += real(client, [call])
        return out

    monkeypatch.setattr(queue_module.scripts, "execute", one_by_one)
    wf = echomq.chord(echomq.group(tasks.add.s(i) for i in range(1200)), tasks.total.s()).send()
    assert not any(interleaved), "members ran before their callback was admitted"
    echomq.Consumer(queue_name, tasks_on(queue_name), redis_url=configured,
                    keep_completed=10).run(burst=True)
    assert wf.result(timeout=10) == sum(range(1200))


def test_an_asyncio_add_many_in_several_calls_is_admitted_whole(
        tasks: Any, configured: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the asyncio producer's add_many with after=, over one block.lua call: as above
    from echomq import aio

    real = aio.execute
    interleaved: list[int] = []

    async def one_by_one(client: Any, calls: Any, **kw: Any) -> Any:
        out = []
        for i, call in enumerate(calls):
            if i:
                interleaved.append(echomq.Consumer(
                    queue_name, tasks_on(queue_name), redis_url=configured,
                    keep_completed=10).run(burst=True))
            out += await real(client, [call], **kw)
        return out

    monkeypatch.setattr(aio, "execute", one_by_one)

    async def admit() -> list[str]:
        aq = aio.Queue(queue_name, redis_url=configured)
        try:
            members = [f"m{i}" for i in range(600)]
            await aq.add_many([(tasks.add.name, {"args": [i], "kwargs": {}}, {"job_id": m})
                               for i, m in enumerate(members)]
                              + [(tasks.total.name, {"args": [], "kwargs": {}},
                                  {"job_id": "cb", "after": members})])
            return members
        finally:
            await aq.close()

    asyncio.run(admit())
    assert not any(interleaved), "members ran before the job waiting for them was admitted"
    q = echomq.Queue(queue_name)
    assert q.get("cb").state == "blocked" and q.counts()["waiting"] == 600
