"""``echomq-supervisor start --middleware MODULE:NAME``: the middleware is built in each
forked consumer and runs around every job, sync and async; a raising hook changes no
outcome; inside a handler every log line carries the job's id, queue, lane and attempt."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

import echomq

from .conftest import wait_until


def _hooks(r: redis.Redis, queue: str) -> list[str]:
    return [x.decode() for x in r.lrange(f"hooks:{queue}", 0, -1)]


@pytest.mark.parametrize(("handler", "middleware", "extra"), [
    ("sup_hooks:work", "sup_hooks:Ledger", []),
    ("sup_hooks:work", "sup_hooks:Ledger", ["--concurrency", "3"]),
    ("sup_hooks:work_async", "sup_hooks:AsyncLedger", ["--concurrency", "3"])],
    ids=["sync", "thread-pool", "async"])
def test_middleware_is_built_in_each_consumer_and_runs_around_jobs(
        supervisor: Any, redis_url: str, queue_name: str, r: redis.Redis, handler: str,
        middleware: str, extra: list[str]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ok = [q.add("w", {"n": i}) for i in range(6)]
    bad = q.add("w", {"fail": True}, max_attempts=1)
    supervisor(redis_url, queue_name, "--handler", handler, "--processes", "2",
               "--middleware", middleware, "--middleware", "sup_hooks:Broken", *extra
               ).started(2)
    wait_until(lambda: len(_hooks(r, queue_name)) >= 2 * len(ok) + 2, 30, "every hook")
    entries = [e.split(":") for e in _hooks(r, queue_name)]
    assert all(built == called for _, _, built, called in entries), "built in the child"
    assert len({called for *_, called in entries}) >= 1
    by_job: dict[str, list[str]] = {}
    for what, jid, _, _ in entries:
        by_job.setdefault(jid, []).append(what)
    for jid in ok:
        assert by_job[jid] == ["before", "after=ok"]
    assert by_job[bad] == ["before", "failure=ValueError,False"]
    wait_until(lambda: q.counts()["completed"] == len(ok), 15, "completions")
    # its failure hook runs before its settle, which may come a round trip later
    wait_until(lambda: getattr(q.get(bad), "state", None) == "dead", 15, "the failed job dead")


def test_a_middleware_that_cannot_be_imported_stops_start(
        supervisor: Any, redis_url: str, queue_name: str) -> None:
    sup = supervisor(redis_url, queue_name, "--handler", "sup_hooks:work",
                     "--middleware", "sup_hooks:Nowhere")
    assert sup.wait() != 0
    assert "sup_hooks" in sup.log and "Nowhere" in sup.log


@pytest.mark.parametrize(("handler", "extra"), [
    ("sup_hooks:work", []), ("sup_hooks:work", ["--concurrency", "2"]),
    ("sup_hooks:work_async", ["--concurrency", "2"])], ids=["sync", "thread-pool", "async"])
def test_json_log_lines_of_a_handler_carry_the_job(
        supervisor: Any, redis_url: str, queue_name: str, handler: str,
        extra: list[str]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = [q.add("w", {"n": i}, lane=f"l{i}") for i in range(4)]
    sup = supervisor(redis_url, queue_name, "--handler", handler, "--log-json", *extra)
    sup.wait_for_log(r'"msg": "working on', count=len(ids))
    lines = [json.loads(x) for x in sup.lines if '"msg": "working on' in x]
    seen = {}
    for line in lines:
        n = int(line["msg"].rsplit(" ", 1)[1])
        assert line["queue"] == queue_name and line["attempt"] == 1
        assert line["lane"] == f"l{n}"
        seen[line["job_id"]] = n
    assert seen == {jid: i for i, jid in enumerate(ids)}
    stray = [x for x in sup.lines if x.startswith("{") and "working on" not in x
             and '"job_id"' in x and '"event"' not in x]
    assert not stray, "no job context on records logged outside a job"
