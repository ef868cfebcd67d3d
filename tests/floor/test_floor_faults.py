"""The floor under forced interleavings: a late sync write against a spill, a re-add of a
spilled job id, malformed rows and hashes, orphaned rows, logs nobody drains, and
leader elections on a large schedule set."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from beats import tick as _tick
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor
from echomq.floor.schema import jobs
from echomq.floor.writethrough import write_through
from echomq.lanes import Lanes, Outcome

HOUR_MS = 3_600_000


def _scheduler(client: redis.Redis, floor: Floor, queue: str, **kw: Any) -> Scheduler:
    return Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600, **kw)


def _rows(floor: Floor, queue: str) -> dict[str, Any]:
    return {r.job_id: r for r in floor.open_rows(queue, None, 100_000)}


def _run_all(q: echomq.Queue, ran: Counter[str]) -> None:
    def handler(job: echomq.Job) -> None:
        ran[job.id] += 1

    q.redis.zadd(q.keys.schedule, {m: 0 for m in q.redis.zrange(q.keys.schedule, 0, -1)})
    echomq.Consumer(q, handler, pump_batch=1000).run(burst=True)


class HookAfterRead(redis.Redis):
    """A client whose next pipeline runs ``hook`` right after its reads came back: the
    moment between a write-through's read of a job and its write to the floor."""

    hook: Callable[[], None] | None = None

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = super().pipeline(*args, **kwargs)
        run, hook = pipe.execute, self.hook
        self.hook = None

        def execute(*a: Any, **kw: Any) -> Any:
            out = run(*a, **kw)
            if hook is not None:
                hook()
            return out

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


def _is_stub(client: redis.Redis, q: echomq.Queue, job_id: str) -> bool:
    """Whether the job's hash is a spilled job's stub: scheduled, marked, no payload."""
    h = client.hgetall(q.keys.job(job_id))
    return h.get(b"spilled") == b"1" and h.get(b"state") == b"scheduled" and b"payload" not in h


def test_sync_write_through_after_a_spill_does_not_unspill_the_job(
        floor: Floor, server: LocalRedis) -> None:
    client = HookAfterRead.from_url(server.url)
    q = echomq.Queue("wt", redis=client, floor=floor, durability="sync")
    sched = _scheduler(redis.Redis.from_url(server.url), floor, "wt")
    _tick(sched)  # leads
    job_id = q.add("far", {"n": 1}, delay=7200)  # its own sync write: unspilled row
    client.hook = lambda: _tick(sched)  # the spill commits between the read and the write
    assert write_through(client, q.keys, floor, [job_id]) == 1  # as a retry's write would
    assert _is_stub(client, q, job_id)
    assert _rows(floor, "wt")[job_id].spilled, "the late write undid the spill"
    sched.clock_offset_ms = 2 * HOUR_MS
    _tick(sched)  # within the horizon now: restored
    assert client.hget(q.keys.job(job_id), "state") == b"scheduled"
    ran: Counter[str] = Counter()
    _run_all(q, ran)
    assert ran == {job_id: 1}


def test_readding_a_spilled_job_id_admits_nothing_and_leaves_no_stuck_counts(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("idem", redis=client)
    sched = _scheduler(client, floor, "idem")
    _tick(sched)
    job_id = q.add("far", {"v": "first"}, job_id="report-7", delay=7200)
    _tick(sched)
    assert _is_stub(client, q, job_id) and q.stats()["spilled"] == 1
    assert q.add("far", {"v": "second"}, job_id=job_id, delay=60) == job_id
    assert q.add("now", {"v": "third"}, job_id=job_id) == job_id
    assert q.add_many([("now", {"v": "fourth"}, {"job_id": job_id})]) == [job_id]
    assert _is_stub(client, q, job_id), "a second job was admitted"
    _tick(sched)
    row = _rows(floor, "idem")[job_id]
    assert row.spilled and json.loads(row.fields["payload"]) == {"v": "first"}
    assert q.counts()["scheduled"] == 1 and q.counts()["waiting"] == 0
    sched.clock_offset_ms = 2 * HOUR_MS
    _tick(sched)
    assert q.stats()["spilled"] == 0 and q.counts()["scheduled"] == 1
    ran: Counter[str] = Counter()
    _run_all(q, ran)
    assert ran == {job_id: 1}
    _tick(sched)  # closes its row
    assert _rows(floor, "idem") == {}
    assert q.stats()["spilled"] == 0 and q.counts()["scheduled"] == 0


def test_spilled_job_ids_stay_reserved_after_valkey_loses_its_data(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("idem2", redis=client)
    sched = _scheduler(client, floor, "idem2")
    _tick(sched)
    job_id = q.add("far", {"v": "first"}, job_id="kept", delay=7200)
    _tick(sched)
    server.restart_empty()
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("idem2", redis=client)
    sched = _scheduler(client, floor, "idem2")
    _tick(sched)  # rehydrates; the job stays spilled
    assert q.stats()["spilled"] == 1
    assert q.add("now", {"v": "again"}, job_id=job_id) == job_id
    assert _is_stub(client, q, job_id) and q.counts()["waiting"] == 0


def test_malformed_due_time_or_floor_row_is_set_aside_dead_not_a_crash(
        floor: Floor, server: LocalRedis, caplog: pytest.LogCaptureFixture) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("bad", redis=client)
    sched = _scheduler(client, floor, "bad")
    _tick(sched)
    good = q.add("fine", {}, delay=600)
    bad = q.add("old", {}, delay=7200)
    # as an older version stored a due time of 1e15 s: a float in the hash
    client.hset(q.keys.job(bad), "due_ms", "1e+18")
    client.zadd(q.keys.schedule, {bad: 1e18})
    with floor._writer.begin() as conn:  # a row no version of the scheduler can read
        conn.execute(sa.insert(jobs).values(queue="bad", job_id="torn", due_ms=1, spilled=True,
                                            fields="{not json", created_ms=1, updated_ms=1))
    for _ in range(3):
        _tick(sched)  # never raises
    dead = {j.id: j for j in q.dead()}
    assert "due_ms" in (dead[bad].error or "") and "torn" in dead
    assert "floor row" in (dead["torn"].error or "")
    assert set(_rows(floor, "bad")) == {good}
    assert q.counts()["scheduled"] == 1 and q.counts()["dead"] == 2
    assert "set aside" in caplog.text


def test_orphaned_floor_rows_of_finished_jobs_are_closed(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("orphan", redis=client, keep_completed=0)
    sched = _scheduler(client, floor, "orphan")
    _tick(sched)
    job_id = q.add("x", {}, delay=600)
    _tick(sched)  # folded
    ran: Counter[str] = Counter()
    _run_all(q, ran)
    _tick(sched)  # closed
    # a late write-through of the job (read before it ran) lands after the close
    floor.upsert("orphan", [echomq.floor.FloorRow(job_id, 1, {"state": "scheduled"})], None)
    live = q.add("y", {}, delay=600)
    _tick(sched)
    sched.next_orphan_check = 0.0
    _tick(sched)
    assert set(_rows(floor, "orphan")) == {live}
    assert sched.snapshot()["orphans_closed"] == 1
    server.restart_empty()  # a data loss must not run the finished job again
    client = redis.Redis.from_url(server.url)
    sched = _scheduler(client, floor, "orphan")
    _tick(sched)
    assert client.zrange(q.keys.schedule, 0, -1) == [live.encode()]


def test_fold_and_closed_logs_stop_growing_when_no_scheduler_runs(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lapse", redis=client, max_attempts=2)
    sched = _scheduler(client, floor, "lapse", fold_grace_s=0.2)
    _tick(sched)
    sched.close()  # the last scheduler leaves; its fold lease runs out
    lapsed = client.hget(q.keys.meta, "fold")
    assert lapsed is not None
    server_ms = int(client.time()[0]) * 1000
    client.hset(q.keys.meta, "fold", server_ms - 1)  # the grace has passed
    ids = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(50)])
    now_ids = q.add_many([("n", {"i": i}) for i in range(20)])
    lanes = Lanes(client, q.keys, q.settings)
    claimed = lanes.claim(20)
    lanes.settle([Outcome(c.id, c.token, "f", "x", 600_000) for c in claimed])
    assert client.llen(q.keys.fold) == 0 and client.llen(q.keys.closed) == 0
    # a new leader finds the lapse and sweeps the schedule set instead
    sched2 = _scheduler(client, floor, "lapse", fold_grace_s=60)
    _tick(sched2)
    _tick(sched2)
    assert set(_rows(floor, "lapse")) == set(ids) | set(now_ids)


def test_leader_election_does_not_resweep_the_schedule_set(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("elect", redis=client)
    sched = _scheduler(client, floor, "elect")
    _tick(sched)
    q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(2000)])
    _tick(sched)
    folded = sched.folded
    assert folded == 2000
    sched.close()
    sched2 = _scheduler(client, floor, "elect")
    _tick(sched2)
    _tick(sched2)
    assert sched2.fence is not None and sched2.folded == 0, "the election re-swept everything"


def test_fold_log_is_bounded_while_the_floor_is_down(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("bound", redis=client)
    sched = _scheduler(client, floor, "bound", max_backlog=100)
    _tick(sched)
    sched.floor_retry_at = float("inf")  # the floor is backing off: leadership only
    ids = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(300)])
    sched.tick(0.0)
    assert client.llen(q.keys.fold) == 0 and sched.snapshot()["backlog_dropped"] == 300
    _tick(sched)  # the floor answers again: the schedule set is swept instead
    assert set(_rows(floor, "bound")) == set(ids)


def test_clock_offset_variable_does_not_move_a_production_scheduler(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from echomq.supervisor.scheduler import make_factory
    from echomq.supervisor.settings import QueueSpec, Settings

    monkeypatch.setenv("ECHOMQ_CLOCK_OFFSET_MS", str(2 * HOUR_MS))
    settings = Settings(redis_url=server.url, queues=(QueueSpec("clock", "m:f"),),
                        floor_url="sqlite:///unused.db")
    rt = SimpleNamespace(spec=settings.queues[0],
                         metronome=SimpleNamespace(client=redis.Redis.from_url(server.url)))
    made = make_factory(settings, floor)(rt)
    assert made is not None
    try:
        assert made.scheduler.clock_offset_ms == 0
    finally:
        made.close()
