"""Under a real supervisor: tasks see their job (``echomq.current_job()``) and steer it with
``Retry``/``Fail``; the consumer that ran a failed job logs it (WARNING per failed attempt,
ERROR with the traceback on death), plain and JSON, within a per-process bound."""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

import echomq
from echomq import failures

from . import sup_current
from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


@pytest.fixture
def tasks(redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[ModuleType]:
    """sup_current on this test's queue, and send() pointed at the test server."""
    monkeypatch.setenv("SUP_CURRENT_QUEUE", queue_name)
    echomq.configure(redis_url=redis_url)
    yield importlib.reload(sup_current)
    echomq.configure(redis_url=None)


def _start(supervisor: Start, redis_url: str, queue_name: str, *args: str) -> Supervisor:
    sup = supervisor(redis_url, queue_name, "--queue", queue_name, "--tasks", "sup_current",
                     "--beat-ms", "200", *args, env={"SUP_CURRENT_QUEUE": queue_name,
                                                     "ECHOMQ_REDIS_URL": redis_url},
                     flags=False)
    return sup.started(1)


def _consumer_pids(sup: Supervisor) -> set[int]:
    return {int(m.group(1)) for line in sup.lines
            if (m := re.search(r"consumer (\d+) started", line))}


@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_tasks_see_their_job_and_steer_it(supervisor: Start, redis_url: str, queue_name: str,
                                          tasks: ModuleType, concurrency: str) -> None:
    sup = _start(supervisor, redis_url, queue_name, "--concurrency", concurrency)
    for t in (tasks.whoami, tasks.awhoami):
        job_id = t.send()
        assert t.result(job_id, timeout=15) == {"id": job_id, "name": t.name, "lane": "me",
                                                "attempts": 1}
        job = echomq.Queue(queue_name).get(job_id)
        assert job is not None and job.progress["pid"] in _consumer_pids(sup)
    lucky = tasks.third_time.send()
    assert tasks.third_time.result(lucky, timeout=15) == 3
    doomed = tasks.give_up.send()
    with pytest.raises(echomq.JobFailed, match="not worth another try"):
        tasks.give_up.result(doomed, timeout=15)
    job = echomq.Queue(queue_name).get(doomed)
    assert job is not None and (job.state, job.attempts) == ("dead", 1)
    sup.wait_for_log(rf"WARNING echomq.jobs .*job {lucky} \(cur.third_time\) .*attempt 2 of 5 "
                     r"failed, will retry: Retry\(delay=0.01\): not yet on attempt 2")
    sup.wait_for_log(rf"ERROR echomq.jobs .*job {doomed} \(cur.give_up\) .*attempt 1 of 5 "
                     r"failed, dead: Fail: not worth another try")


def test_failures_are_logged_by_the_consumer_that_ran_them(
        supervisor: Start, redis_url: str, queue_name: str, tasks: ModuleType) -> None:
    """At the default level: a WARNING per failed attempt, an ERROR with the traceback on
    death, each from the consumer's pid, naming the job, its task, lane and attempt."""
    sup = _start(supervisor, redis_url, queue_name, "--processes", "2")
    job_id = tasks.flaky.options(lane="acct-7").send(7)
    with pytest.raises(echomq.JobFailed):
        tasks.flaky.result(job_id, timeout=15)
    [warning] = sup.wait_for_log(rf"job {job_id} .*will retry")
    assert re.search(rf"WARNING echomq.jobs \[(\d+)\] job {job_id} \(cur.flaky\) on queue "
                     rf"{queue_name} lane acct-7, attempt 1 of 2 failed, will retry: "
                     r"ValueError: mailbox 7 is full$", warning), warning
    # "failed, dead:", not "dead" alone: a random queue name may hold those letters
    [death] = sup.wait_for_log(rf"job {job_id} .*failed, dead: ")
    assert re.search(rf"ERROR echomq.jobs \[\d+\] job {job_id} \(cur.flaky\) on queue "
                     rf"{queue_name} lane acct-7, attempt 2 of 2 failed, dead: ValueError: "
                     r"mailbox 7 is full$", death), death
    pids = {int(m.group(1)) for line in (warning, death)
            if (m := re.search(r"\[(\d+)\]", line))}
    assert pids <= _consumer_pids(sup) and sup.proc.pid not in pids
    after = sup.lines[sup.lines.index(death) + 1:]
    wait_until(lambda: any("the second line stays" in line for line in sup.lines), 5,
               "the traceback after the death")
    assert after[0].startswith("Traceback (most recent call last):"), after[:5]


def test_failure_logs_in_json(supervisor: Start, redis_url: str, queue_name: str,
                              tasks: ModuleType) -> None:
    sup = _start(supervisor, redis_url, queue_name, "--log-json")
    job_id = tasks.flaky.send(3)
    with pytest.raises(echomq.JobFailed):
        tasks.flaky.result(job_id, timeout=15)
    sup.wait_for_log(rf'"job_dead".*"{job_id}"|"{job_id}".*"job_dead"')
    records = [json.loads(line) for line in sup.lines if line.startswith("{")]
    mine = [rec for rec in records if rec.get("job_id") == job_id
            and rec.get("logger") == "echomq.jobs"]
    assert [(rec["level"], rec["event"], rec["attempt"]) for rec in mine] == [
        ("warning", "job_failed", 1), ("error", "job_dead", 2)]
    for rec in mine:
        assert (rec["job_name"], rec["lane"], rec["queue"], rec["max_attempts"]) == (
            "cur.flaky", "default", queue_name, 2)
        assert rec["pid"] != sup.proc.pid and "ValueError: mailbox 3 is full" in rec["msg"]
    assert "exc" not in mine[0] and mine[1]["exc"].startswith("Traceback")
    assert "the second line stays" in mine[1]["exc"]


def test_a_flood_of_failures_is_bounded_and_counted(
        supervisor: Start, redis_url: str, queue_name: str, tasks: ModuleType) -> None:
    sup = _start(supervisor, redis_url, queue_name, "--processes", "1")
    flood = 3 * failures.BURST
    began = time.monotonic()
    q = echomq.Queue(queue_name)
    for n in range(flood):
        tasks.doomed.send(n)
    wait_until(lambda: q.counts()["dead"] == flood, 30, "every job of the flood dead")
    elapsed = time.monotonic() - began

    def job_lines() -> list[str]:
        return [line for line in sup.lines if "echomq.jobs" in line and "dead: KeyError" in line]

    wait_until(lambda: len(job_lines()) >= failures.BURST, 5, "a burst of failure logs")
    logged = len(job_lines())
    assert logged <= failures.BURST + elapsed * failures.PER_S + 1, logged
    # the count of those left out comes with the next failure logged, just before it
    sent = flood
    deadline = time.monotonic() + 20
    while not any("failure logs suppressed" in line for line in sup.lines):
        assert time.monotonic() < deadline, sup.log[-3000:]
        last = tasks.doomed.send(sent)
        sent += 1
        with pytest.raises(echomq.JobFailed):
            tasks.doomed.result(last, timeout=15)
    at = next(i for i, line in enumerate(sup.lines) if "failure logs suppressed" in line)
    wait_until(lambda: len(sup.lines) > at + 1, 5, "the failure logged after the summary")
    suppressed = int(sup.lines[at].split(" failure logs suppressed")[0].rsplit(" ", 1)[1])
    then = int(sup.lines[at + 1].rsplit("dead: KeyError: ", 1)[1])  # the one job runs in order
    assert len([line for line in sup.lines[:at + 2] if "dead: KeyError" in line]) + suppressed \
        == then + 1


def test_the_supervisor_says_which_server_it_uses(supervisor: Start, redis_url: str,
                                                  queue_name: str, tasks: Any) -> None:
    """ECHOMQ_REDIS_URL alone (no --redis-url) is the server, named at start."""
    env = {"SUP_CURRENT_QUEUE": queue_name, "ECHOMQ_REDIS_URL": redis_url}
    sup = supervisor(redis_url, queue_name, "--queue", queue_name, "--tasks", "sup_current",
                     env=env, flags=False)
    sup.wait_for_log(rf"supervisor started: {re.escape(redis_url)}")
    assert tasks.whoami.result(tasks.whoami.send(), timeout=15)["attempts"] == 1
