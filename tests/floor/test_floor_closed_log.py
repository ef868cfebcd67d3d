"""The scheduler's closed log (closed_read.lua): the floor rows of finished jobs go, the
rows of a new job under a finished job's id stay, and the log is trimmed by what was
read. Real Valkey, real SQLite files and PostgreSQL."""

from __future__ import annotations

import time

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor


def _tick(scheduler: Scheduler) -> None:
    scheduler.next_tick = 0.0
    scheduler.floor_retry_at = 0.0
    scheduler.tick(time.monotonic())


def _open(floor: Floor, queue: str) -> list[str]:
    return [r.job_id for r in floor.open_rows(queue, None, 100)]


@pytest.mark.parametrize("delay", [None, 3600.0], ids=["waiting", "scheduled"])
def test_a_job_added_again_under_a_closed_id_keeps_its_floor_row(
        floor: Floor, server: LocalRedis, delay: float | None) -> None:
    """A durable job completes (its id enters the closed log) and retention drops its
    hash; before the scheduler reads the log the same id is added again: that new job's
    row stays, and the log entry is trimmed all the same."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("cla", client, floor, beat_ms=100, horizon_s=7 * 86400)
    scheduler.tick(0.0)  # leads: the queue folds
    q = echomq.Queue("cla", redis=client, floor=floor, durability="durable",
                     keep_completed=0)
    q.add("x", {}, job_id="again")
    ran: list[str] = []
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == ["again"] and q.get("again") is None
    assert client.lrange(q.keys.closed, 0, -1) == [b"again"]
    q.add("x", {"n": 2}, job_id="again", delay=delay)
    _tick(scheduler)
    assert _open(floor, "cla") == ["again"]
    [row] = floor.open_rows("cla", None, 1)
    assert '"n":2' in row.fields["payload"]  # the new job's row
    assert client.llen(q.keys.closed) == 0


def test_finished_jobs_lose_their_rows_and_a_spilled_id_keeps_its_own(
        floor: Floor, server: LocalRedis) -> None:
    """Closed ids whose jobs finished lose their rows; a closed id held by the floor
    alone (in the spilled set with no hash: a job spilled before spills left a stub)
    keeps its row: that row is the job."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("cls", client, floor, beat_ms=100, horizon_s=3600)
    scheduler.tick(0.0)
    q = echomq.Queue("cls", redis=client, floor=floor, durability="durable",
                     keep_completed=0)
    done = q.add_many([("x", {}) for _ in range(3)])
    echomq.Consumer(q, lambda job: None).run(burst=True)
    q.add("x", {}, job_id="far", delay=30 * 86400)  # beyond the horizon: spilled
    _tick(scheduler)
    assert client.sismember(q.keys.spilled, "far") and _open(floor, "cls") == ["far"]
    client.delete(q.keys.job("far"))  # spilled with no stub
    client.rpush(q.keys.closed, "far", *done)  # an earlier job under "far" finished
    _tick(scheduler)
    assert _open(floor, "cls") == ["far"]
    assert client.llen(q.keys.closed) == 0


def test_a_scheduler_that_stops_closes_the_rows_of_the_jobs_finished_since_its_last_beat(
        floor: Floor, server: LocalRedis) -> None:
    """A supervisor stopped (SIGTERM) between two beats: the jobs its consumers finished
    meanwhile have their rows closed before it hands the lead on, not whenever the next
    leader's beat gets to them (a loss of Valkey's data meanwhile ran them again)."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("clc", client, floor, beat_ms=100, horizon_s=3600)
    _tick(scheduler)  # leads: the queue folds
    q = echomq.Queue("clc", redis=client, floor=floor, durability="durable")
    ids = q.add_many([("x", {"n": i}) for i in range(3)])
    assert sorted(_open(floor, "clc")) == sorted(ids)
    echomq.Consumer(q, lambda job: None).run(burst=True)
    assert client.llen(q.keys.closed) == 3
    scheduler.close()
    assert _open(floor, "clc") == []
    assert client.get(q.keys.leader) is None  # and the lead is handed on
    q.close()


def test_rows_of_jobs_finished_during_a_long_rehydration_close_each_beat(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rehydration that takes many beats (a big floor) closes, at each of them, the rows
    of the jobs finished meanwhile: their rows open until it ended were run again by a
    loss of Valkey's data in that time."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("cld", client, floor, beat_ms=100, horizon_s=3600)
    _tick(scheduler)
    q = echomq.Queue("cld", redis=client, floor=floor, durability="durable")
    ids = q.add_many([("x", {"n": i}) for i in range(3)])
    client.delete(q.keys.epoch)  # Valkey lost its data, as far as the scheduler can tell
    monkeypatch.setattr(Scheduler, "_rehydrate", lambda self, now, epoch: False)  # unended
    echomq.Consumer(q, lambda job: None).run(burst=True)
    _tick(scheduler)
    assert _open(floor, "cld") == []
    assert sorted(ids) and client.llen(q.keys.closed) == 0
    q.close()


@pytest.mark.parametrize("kind", ["waiting", "scheduled", "blocked"])
def test_a_rehydration_that_meets_the_open_row_of_a_job_finished_and_dropped_leaves_it(
        floor: Floor, server: LocalRedis, kind: str) -> None:
    """A job added while a rehydration is under way finishes, and its hash goes at once
    (keep_completed=0), before the beat closes its row: the rehydration that reads the row
    then must not put the job back (it ran once; it would run again). Its row says
    waiting, scheduled (added with a delay) or blocked (a chord's callback)."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("clt", client, floor, beat_ms=100, horizon_s=3600)
    _tick(scheduler)
    q = echomq.Queue("clt", redis=client, floor=floor, durability="durable",
                     keep_completed=0)
    if kind == "blocked":
        ids = q.add_many([("x", {}, {"job_id": "m"}), ("x", {}, {"job_id": "cb", "after": ["m"]})])
    else:
        ids = q.add_many([("x", {}, {"delay": 0.05} if kind == "scheduled" else {})])
        time.sleep(0.1)  # past its due time (a clock, no event): the consumer promotes it
    rows = {r.job_id: r.fields["state"] for r in floor.rows("clt", ids)}
    assert set(rows.values()) == ({"waiting", "blocked"} if kind == "blocked" else {kind}), rows
    ran: list[str] = []
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert sorted(ran) == sorted(ids)
    assert not any(client.exists(q.keys.job(i)) for i in ids)
    assert sorted(_open(floor, "clt")) == sorted(ids)  # their closes not written yet
    client.delete(q.keys.epoch)
    scheduler.budget_end = time.monotonic() + 30  # the beat's rows read before its close
    assert scheduler._rehydrate(int(client.time()[0]) * 1000, "")
    assert [q.get(i) for i in ids] == [None] * len(ids)
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert sorted(ran) == sorted(ids)
    q.close()


def _fail(job: echomq.Job) -> None:
    raise RuntimeError("planned death")


@pytest.mark.parametrize(("kind", "end"), [
    ("waiting", "dead-trimmed"), ("scheduled", "dead-trimmed"), ("blocked", "dead-trimmed"),
    ("waiting", "dead-purged"), ("waiting", "cancelled-purged"),
    ("waiting", "completed-purged"),
])
def test_a_rehydration_that_meets_the_open_row_of_a_job_ended_and_purged_leaves_it(
        floor: Floor, server: LocalRedis, kind: str, end: str) -> None:
    """A job added while a rehydration is under way dies, is cancelled or completes, and
    its record goes (the dead retention's trim, or purge()) before the beat closes its
    row: the rehydration that reads the row then must not put the job back (it ended;
    it would run again). Its row says waiting, scheduled or blocked (a chord's
    callback)."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("clp", client, floor, beat_ms=100, horizon_s=3600)
    _tick(scheduler)
    q = echomq.Queue("clp", redis=client, floor=floor, durability="durable")
    once = {"max_attempts": 1}
    if kind == "blocked":  # the member completes (its record kept), then the callback ends
        _, jid = q.add_many([("x", {}, {"job_id": "m"}),
                             ("x", {}, {"job_id": "cb", "after": ["m"], **once})])
    else:
        (jid,) = q.add_many([("x", {}, {"delay": 0.05, **once} if kind == "scheduled"
                              else once)])
        time.sleep(0.1)  # past its due time (a clock, no event): the consumer promotes it
    assert floor.rows("clp", [jid])[0].fields["state"] == ("blocked" if kind == "blocked"
                                                           else kind)
    ran: list[str] = []
    state = end.split("-")[0]
    if state == "cancelled":  # by a producer without the floor: the beat closes its row
        assert echomq.Queue("clp", redis=client).cancel(jid)
    else:
        def handler(job: echomq.Job) -> None:
            if job.id == jid and state == "dead":
                _fail(job)
            ran.append(job.id)

        echomq.Consumer(q, handler).run(burst=True)
    assert q.get(jid).state == state  # type: ignore[union-attr]
    if end == "dead-trimmed":
        assert echomq.scripts.trim_dead(client, q.keys, 0, -1, 100) == 1
    else:
        assert q.purge(state) >= 1
    assert not client.exists(q.keys.job(jid))
    assert jid in _open(floor, "clp")  # its close not written yet
    client.delete(q.keys.epoch)
    scheduler.budget_end = time.monotonic() + 30  # the beat's rows read before its close
    assert scheduler._rehydrate(int(client.time()[0]) * 1000, "")
    assert q.get(jid) is None
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran.count(jid) == (1 if state == "completed" else 0)
    q.close()


def test_a_rehydration_leaves_the_row_of_a_spilled_job_cancelled_and_purged(
        floor: Floor, server: LocalRedis) -> None:
    """A job spilled to the floor (due beyond the horizon) is cancelled by a producer
    without the floor, then purged, before the beat closes its row: the rehydration that
    reads the row must not write it a stub again (a restore would bring it back)."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("cls", client, floor, beat_ms=100, horizon_s=60)
    _tick(scheduler)
    q = echomq.Queue("cls", redis=client, floor=floor)
    jid = q.add("x", {}, delay=3600)
    _tick(scheduler)  # folded, then spilled: due beyond the horizon
    _tick(scheduler)
    assert client.sismember(q.keys.spilled, jid)
    assert echomq.Queue("cls", redis=client).cancel(jid)
    assert q.purge("cancelled") == 1
    assert jid in _open(floor, "cls")  # its close not written yet
    client.delete(q.keys.epoch)
    scheduler.budget_end = time.monotonic() + 30  # the beat's rows read before its close
    assert scheduler._rehydrate(int(client.time()[0]) * 1000, "")
    assert q.get(jid) is None and not client.sismember(q.keys.spilled, jid)
    q.close()


def test_a_rehydration_counts_a_dependency_that_died_and_was_trimmed_meanwhile_as_dead(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Valkey lost its data: the rehydration puts a member back on its lane and holds its
    chord's callback. The member dies and the dead retention drops it before the fan-in
    is rebuilt: the callback must end dead, not take the gone member for completed."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("clf", client, floor, beat_ms=100, horizon_s=3600)
    _tick(scheduler)
    q = echomq.Queue("clf", redis=client, floor=floor, durability="durable")
    q.add_many([("x", {}, {"job_id": "m", "max_attempts": 1}),
                ("x", {}, {"job_id": "cb", "after": ["m"]})])
    client.flushdb()  # Valkey loses its data
    scheduler.budget_end = time.monotonic() + 30
    monkeypatch.setattr(Scheduler, "_rebuild_fanin", lambda self: False)  # not yet
    assert not scheduler._rehydrate(int(client.time()[0]) * 1000, "")
    assert q.get("cb").state == "blocked"  # type: ignore[union-attr]
    echomq.Consumer(q, _fail).run(burst=True)
    assert echomq.scripts.trim_dead(client, q.keys, 0, -1, 100) == 1
    assert q.get("m") is None
    monkeypatch.undo()
    epoch = client.get(q.keys.epoch).decode()  # type: ignore[union-attr]
    assert scheduler._rehydrate(int(client.time()[0]) * 1000, epoch)
    cb = q.get("cb")
    assert cb is not None and (cb.state, cb.error) == ("dead", "dependency m dead")
    q.close()
