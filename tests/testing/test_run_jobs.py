"""echomq.testing.run_jobs: jobs run in this process through the real scripts."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import echomq
from echomq.testing import JobsFailed, make_due, run_jobs
from echomq.testing.server import remove_queue

calls: list[str] = []


@echomq.task(queue="rj-tasks")
def add(a: int, b: int) -> int:
    calls.append(threading.current_thread().name)
    return a + b


@pytest.fixture
def q(redis_url: str, queue_name: str) -> echomq.Queue:
    return echomq.Queue(queue_name, redis_url=redis_url)


def test_runs_every_job_in_this_thread_and_returns_them_as_they_ended(q: echomq.Queue) -> None:
    ids = [q.add("double", {"n": n}) for n in range(5)]
    seen: list[str] = []

    def handler(job: echomq.Job) -> int:
        seen.append(threading.current_thread().name)
        return int(job.payload["n"]) * 2

    jobs = run_jobs(q, handler)
    assert [j.id for j in jobs] == ids
    assert [(j.state, j.result) for j in jobs] == [("completed", n * 2) for n in range(5)]
    assert set(seen) == {threading.current_thread().name}
    assert q.counts()["waiting"] == 0 and q.counts()["completed"] == 5
    assert run_jobs(q, handler) == []  # none left


def test_jobs_added_by_a_job_run_too(q: echomq.Queue) -> None:
    q.add("parent", None)

    def handler(job: echomq.Job) -> str:
        if job.name == "parent":
            q.add("child", None)
        return job.name

    assert [j.result for j in run_jobs(q, handler)] == ["parent", "child"]


def test_a_failure_is_recorded_and_raise_on_failure_names_it(q: echomq.Queue) -> None:
    good = q.add("ok", None)
    bad = q.add("boom", None, max_attempts=1)

    def handler(job: echomq.Job) -> str:
        if job.name == "boom":
            raise ValueError("no such order 7")
        return "fine"

    jobs = {j.id: j for j in run_jobs(q, handler)}
    assert jobs[good].state == "completed"
    assert jobs[bad].state == "dead" and "ValueError: no such order 7" in (jobs[bad].error or "")
    bad2 = q.add("boom", None, max_attempts=1)
    with pytest.raises(JobsFailed) as info:
        run_jobs(q, handler, raise_on_failure=True)
    assert isinstance(info.value, AssertionError)
    text = str(info.value)
    assert f"job {bad2} 'boom'" in text and "dead, attempt 1 of 1" in text
    assert "no such order 7" in text and "Traceback" in text


def test_a_retry_waits_for_its_backoff_unless_advanced(q: echomq.Queue) -> None:
    attempts: list[int] = []

    def flaky(job: echomq.Job) -> str:
        attempts.append(job.attempts)
        if job.attempts < 3:
            raise echomq.Retry(delay=600)
        return "done"

    jid = q.add("flaky", None, max_attempts=5)
    with pytest.raises(JobsFailed, match="scheduled, attempt 1 of 5") as info:
        run_jobs(q, flaky, raise_on_failure=True)  # its retry is not due: as it stands now
    [job] = info.value.jobs
    assert job.state == "scheduled" and attempts == [1]
    assert run_jobs(q, flaky) == []
    [job] = run_jobs(q, flaky, advance=601)
    assert (job.id, job.state, job.result, job.attempts) == (jid, "completed", "done", 3)
    assert attempts == [1, 2, 3]


def test_delayed_jobs_run_when_due_within_advance_or_at_now(q: echomq.Queue) -> None:
    soon = q.add("x", 1, delay=30)
    later = q.add("x", 2, delay=3600)
    assert run_jobs(q, lambda job: job.payload) == []
    assert [j.id for j in run_jobs(q, lambda job: job.payload, advance=60)] == [soon]
    assert q.get(later).state == "scheduled"
    at = datetime.now(UTC) + timedelta(hours=2)
    assert [j.id for j in run_jobs(q, lambda job: job.payload, now=at)] == [later]


def test_make_due_moves_only_what_is_due_within_the_window(q: echomq.Queue) -> None:
    q.add("x", 1, delay=10)
    q.add("x", 2, delay=1000)
    assert make_due(q, 20) == 1
    assert make_due(q, math.inf) == 2  # the first is due already and keeps its place
    with pytest.raises(ValueError):
        make_due(q, 0)


def test_tasks_run_by_name_and_the_registered_ones_by_default(redis_url: str) -> None:
    q = echomq.Queue("rj-tasks", redis_url=redis_url)
    echomq.configure(redis_url=redis_url)
    try:
        jid = add.send(2, 3)
        [job] = run_jobs(q, tasks=[add])
        assert (job.id, job.result) == (jid, 5)
        add.send(4, 5)
        assert [j.result for j in run_jobs("rj-tasks")] == [9]  # by name, the default server
        add.send(1, 1)
        assert [j.result for j in run_jobs(q, tasks=[__name__])] == [2]
    finally:
        echomq.configure(redis_url=None)
        remove_queue(q)


def test_unknown_names_die_with_a_clear_error(q: echomq.Queue) -> None:
    q.add("nobody", None)
    with pytest.raises(JobsFailed, match="unknown handler 'nobody'"):
        run_jobs(q, {"other": lambda job: None}, raise_on_failure=True)


def test_async_handlers_run_too(q: echomq.Queue) -> None:
    async def handler(job: echomq.Job) -> int:
        return int(job.payload) + 1

    q.add("a", 1)
    assert [j.result for j in run_jobs(q, handler)] == [2]


def test_bad_arguments_are_refused(q: echomq.Queue) -> None:
    with pytest.raises(echomq.ConfigError, match="no handler given"):
        run_jobs(q)
    with pytest.raises(ValueError, match="not both"):
        run_jobs(q, lambda j: None, advance=1, now=datetime.now(UTC))
    with pytest.raises(ValueError, match="aware"):
        run_jobs(q, lambda j: None, now=datetime.now())
    with pytest.raises(ValueError, match="advance"):
        run_jobs(q, lambda j: None, advance=-1)


def test_remove_queue_deletes_every_key(q: echomq.Queue, r) -> None:  # type: ignore[no-untyped-def]
    q.add("x", 1)
    q.add("y", 2, delay=100)
    assert r.keys(q.keys.prefix.replace("{", "\\{").replace("}", "\\}") + "*")
    assert remove_queue(q) > 0
    assert r.keys(q.keys.prefix.replace("{", "\\{").replace("}", "\\}") + "*") == []
    assert q.name not in echomq.Queue.registered(r)


@echomq.task(queue="rj-flow")
def double(n: int) -> int:
    return n * 2


@echomq.task(queue="rj-flow")
def total(values: list[int]) -> int:
    return sum(values)


@pytest.fixture
def flow(redis_url: str) -> Iterator[echomq.Queue]:
    """The workflow tasks' queue on the test server, removed after."""
    q = echomq.Queue("rj-flow", redis_url=redis_url)
    echomq.configure(redis_url=redis_url)
    try:
        yield q
    finally:
        echomq.configure(redis_url=None)
        remove_queue(q)


def test_a_chain_runs_to_its_end_in_one_call(flow: echomq.Queue) -> None:
    wf = echomq.chain(double.s(1), double.s(), double.s()).send()
    assert flow.counts()["blocked"] == 2  # waiting for the job before each
    jobs = run_jobs(flow, raise_on_failure=True)
    # each claimable as the one before it completed
    assert [j.result for j in jobs] == [2, 4, 8]
    assert wf.result(timeout=5) == 8
    assert flow.counts()["blocked"] == 0 and flow.counts()["waiting"] == 0


def test_a_chord_runs_its_group_then_its_callback_in_one_call(flow: echomq.Queue) -> None:
    wf = echomq.chord(echomq.group(double.s(n) for n in range(1, 4)), total.s()).send()
    jobs = run_jobs(flow, tasks=[double, total], raise_on_failure=True)
    assert sorted(j.result for j in jobs[:3]) == [2, 4, 6]
    assert (jobs[-1].name, jobs[-1].result) == (total.name, 12)
    assert wf.result(timeout=5) == 12


def test_a_chain_stops_where_a_job_dies(flow: echomq.Queue) -> None:
    echomq.chain(double.s("x").set(max_attempts=1), double.s()).send()

    def broken(job: echomq.Job) -> None:
        raise ValueError("no number")

    jobs = run_jobs(flow, {double.name: broken})
    assert [j.state for j in jobs] == ["dead"]  # its follower never became claimable
    assert flow.counts()["blocked"] == 0 and flow.counts()["waiting"] == 0
