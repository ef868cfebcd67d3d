"""A job spilled to the floor (due beyond the horizon) stays visible in Valkey as a stub:
``get``, ``result``, ``jobs("scheduled")``, the ``echomq`` CLI and the dashboard see it,
with or without a floor on the reading side; the stub is never run, never folded over its
row and never blocks its restore, on SQLite and PostgreSQL, with the real scheduler."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from beats import tick as _tick
from echomq.supervisor.drills.localredis import LocalRedis, free_port
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor
from echomq.ops import cli as ops_cli
from echomq.ops.dashboard import Dashboard

HOUR_MS = 3_600_000
PAYLOAD = {"to": "far@example.com", "blob": "x" * 500}


def _scheduler(client: redis.Redis, floor: Floor, queue: str) -> Scheduler:
    s = Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600)
    client.hset(f"emq:{{{queue}}}:meta", "fold", "1")
    return s


def _wait(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _spill(client: redis.Redis, q: echomq.Queue, sched: Scheduler, n: int = 1) -> list[str]:
    _tick(sched)
    ids = [q.add("far", PAYLOAD, lane="tenant-7", delay=7200, max_attempts=4)
           for _ in range(n)]
    _tick(sched)
    assert all(client.sismember(q.keys.spilled, i) for i in ids)
    assert client.zscore(q.keys.schedule, ids[0]) is None  # out of the schedule set
    return ids


def test_get_sees_a_spilled_job_with_or_without_a_floor(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("seen", redis=client)
    sched = _scheduler(client, floor, "seen")
    (far,) = _spill(client, q, sched)
    job = q.get(far)
    assert job is not None
    assert (job.id, job.name, job.lane, job.state, job.max_attempts) == (
        far, "far", "tenant-7", "scheduled", 4)
    assert job.spilled and job.payload is None  # the payload is on the floor alone
    assert job.due_ms is not None and job.due_ms > job.created_ms + 7_000_000
    assert not client.hexists(q.keys.job(far), "payload")  # the memory is given back
    with_floor = echomq.Queue("seen", redis=client, floor=floor)
    full = with_floor.get(far)
    assert full is not None and full.payload == PAYLOAD and full.spilled
    assert full.due_ms == job.due_ms
    down = Floor.from_url(f"postgresql://echomq@127.0.0.1:{free_port()}/x", connect_timeout_s=2)
    stub = echomq.Queue("seen", redis=client, floor=down).get(far)  # the floor is down
    assert stub is not None and stub.spilled and stub.payload is None

    async def aio_get() -> echomq.Job | None:
        aq = echomq.aio.Queue("seen", redis_url=server.url)
        try:
            return await aq.get(far)
        finally:
            await aq.close()

    seen = asyncio.run(aio_get())
    assert seen is not None and seen.state == "scheduled" and seen.spilled
    sched.close()


def test_jobs_lists_spilled_jobs_after_the_schedule_set_page_by_page(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("listed", redis=client)
    sched = _scheduler(client, floor, "listed")
    far = set(_spill(client, q, sched, n=300))  # a set past the listpack encoding
    near = [q.add("near", {}, delay=60) for _ in range(3)]
    assert [j.id for j in q.jobs("scheduled", limit=3)] == near
    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        page, cursor = q.jobs_page("scheduled", limit=7, cursor=cursor)
        assert len(page) <= 7
        seen += [j.id for j in page]
        pages += 1
        if not cursor:
            break
        assert pages < 200, "the cursor never ends"
    assert seen[:3] == near and set(seen[3:]) == far and len(seen) == 303
    assert all(j.state == "scheduled" for j in q.jobs("scheduled", limit=400))
    sched.close()


def test_the_cli_and_the_dashboard_show_a_spilled_job(
        floor: Floor, server: LocalRedis, capsys: pytest.CaptureFixture[str]) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("shown", redis=client)
    sched = _scheduler(client, floor, "shown")
    (far,) = _spill(client, q, sched)
    capsys.readouterr()
    assert ops_cli.main(["--redis-url", server.url, "--json", "show", "shown", far]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == far and shown["state"] == "scheduled"
    assert ops_cli.main(["--redis-url", server.url, "--json", "jobs", "shown",
                         "--state", "scheduled"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [j["id"] for j in listed["jobs"]] == [far]
    board = Dashboard(redis.Redis.from_url(server.url))
    status, _headers, body = board.handle("GET", f"/?queue=shown&job={far}")[:3]
    text = body.decode() if isinstance(body, bytes) else str(body)
    assert status == 200 and far in text and "scheduled" in text and "unknown job" not in text
    sched.close()


def test_result_waits_for_a_spilled_job_through_its_restore(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("waited", redis=client)
    sched = _scheduler(client, floor, "waited")
    (far,) = _spill(client, q, sched)
    outcome: dict[str, Any] = {}

    def waiter() -> None:
        try:
            outcome["value"] = echomq.Queue("waited", redis_url=server.url).result(far, 30)
        except Exception as exc:  # noqa: BLE001 - the test reports what was raised
            outcome["error"] = exc

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    _wait(lambda: client.hexists(q.keys.job(far), "waited") or outcome, 10, "the waiter")
    assert "error" not in outcome, outcome
    sched.clock_offset_ms = 2 * HOUR_MS  # two hours on: the job comes within the horizon
    _tick(sched)
    assert not client.sismember(q.keys.spilled, far)
    restored = q.get(far)
    assert restored is not None and restored.payload == PAYLOAD and not restored.spilled
    ran: Counter[str] = Counter()

    def handler(job: echomq.Job) -> str:
        ran[job.id] += 1
        return f"sent to {job.payload['to']}"

    client.zadd(q.keys.schedule, {far: 0})  # due now on the real clock
    echomq.Consumer(q, handler).run(burst=True)
    thread.join(30)
    assert outcome == {"value": "sent to far@example.com"} and ran == {far: 1}
    sched.close()


def test_re_adding_a_spilled_id_admits_nothing(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("readd", redis=client)
    sched = _scheduler(client, floor, "readd")
    _tick(sched)
    far = q.add("far", PAYLOAD, delay=7200, job_id="mail-7")
    _tick(sched)
    before = client.hgetall(q.keys.job(far))
    assert q.add("other", {"new": 1}, job_id="mail-7") == "mail-7"
    assert q.add("other", {"new": 1}, job_id="mail-7", delay=5) == "mail-7"
    assert client.hgetall(q.keys.job(far)) == before
    assert q.counts()["scheduled"] == 1 and q.counts()["waiting"] == 0
    (row,) = floor.rows("readd", ["mail-7"])
    assert json.loads(row.fields["payload"]) == PAYLOAD
    sched.close()


def test_a_far_job_rehydrated_after_valkey_loss_is_seen_and_runs_once(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lost", redis=client)
    sched = _scheduler(client, floor, "lost")
    (far,) = _spill(client, q, sched)
    sched.close()
    server.restart_empty()
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lost", redis=client)
    sched = _scheduler(client, floor, "lost")
    _tick(sched)  # rehydrates: the far job stays on the floor, as a stub in Valkey
    job = q.get(far)
    assert job is not None and (job.state, job.spilled, job.lane) == (
        "scheduled", True, "tenant-7")
    assert q.counts()["scheduled"] == 1 and q.stats()["spilled"] == 1
    sched.clock_offset_ms = 2 * HOUR_MS
    _tick(sched)
    restored = q.get(far)
    assert restored is not None and restored.payload == PAYLOAD
    ran: Counter[str] = Counter()
    client.zadd(q.keys.schedule, {far: 0})
    echomq.Consumer(q, lambda j: ran.update([j.id])).run(burst=True)
    assert ran == {far: 1}
    sched.close()


def test_a_stub_is_never_run_nor_copied_over_its_row(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("inert", redis=client)
    sched = _scheduler(client, floor, "inert")
    (far,) = _spill(client, q, sched)
    ran: Counter[str] = Counter()
    echomq.Consumer(q, lambda j: ran.update([j.id])).run(burst=True)  # reap, promote, drain
    assert ran == Counter() and q.get(far).state == "scheduled"  # type: ignore[union-attr]
    # the stub's id met again by the fold (a sync write-through of a re-add under that
    # id logs it the same way): the floor's row stays the job's, payload and all
    client.rpush(q.keys.fold, far)
    _tick(sched)
    (row,) = floor.rows("inert", [far])
    assert row.spilled and json.loads(row.fields["payload"]) == PAYLOAD
    sched.clock_offset_ms = 2 * HOUR_MS
    _tick(sched)
    restored = q.get(far)
    assert restored is not None and restored.payload == PAYLOAD and not restored.spilled
    sched.close()



def test_a_spilled_job_keeps_its_expiry_when_its_id_is_added_again(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("spillexp", redis=client, floor=floor)
    sched = _scheduler(client, floor, "spillexp")
    _tick(sched)
    job_id = q.add("far", PAYLOAD, delay=7200, expires=86400, job_id="far-1")
    at = client.zscore("emq:{spillexp}:expiring", job_id)
    _tick(sched)
    assert client.sismember(q.keys.spilled, job_id)
    # the same id again, with the same payload and a short expiry: the stub is not the job
    assert q.add("far", PAYLOAD, delay=7200, expires=0.05, job_id="far-1") == job_id
    assert q.add_many([("far", PAYLOAD, {"delay": 7200, "expires": 0.05,
                                         "job_id": "far-1"})]) == [job_id]
    assert client.zscore("emq:{spillexp}:expiring", job_id) == at
    assert client.hget(q.keys.job(job_id), "state") == b"scheduled"
