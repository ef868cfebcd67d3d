"""Blocked jobs (waiting for dependencies) on the floor: after Valkey loses its data they
come back blocked, their fan-in rebuilt, under the "durable" and the "folded" dial.

The rule for a dependency that ended before the loss: its row was closed, so it is not
back; a dependency with no open row counts as completed (its result is the one the
dependent's row recorded, else None). A dead or cancelled dependency ended its "fail"
dependents in the same script, and their rows close with its own."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from beats import tick as _tick
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq import scripts
from echomq.floor import Floor
from echomq.lanes import Lanes, Outcome


def _scheduler(client: redis.Redis, floor: Floor, queue: str) -> Scheduler:
    s = Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600)
    client.hset(f"emq:{{{queue}}}:meta", "fold", "1")  # as a leading scheduler's lease
    return s


def _wipe(client: redis.Redis, sched: Scheduler) -> None:
    """Valkey loses its data; the scheduler rehydrates from the floor."""
    client.flushall()
    sched.tick(0.0)  # notices the epoch gone
    _tick(sched)


def _complete(client: redis.Redis, q: echomq.Queue, job_id: str, result: str) -> None:
    """Run the head of the queue, which must be ``job_id``, to completion."""
    lanes = Lanes(client, q.keys, q.settings)
    [claimed] = lanes.claim(1)
    assert claimed.id == job_id
    lanes.settle([Outcome(claimed.id, claimed.token, "c", result, 0)])


def _run(q: echomq.Queue) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Run everything runnable; the ids in run order and each one's dependency results."""
    ran: list[str] = []
    seen: dict[str, dict[str, Any]] = {}

    def handler(job: echomq.Job) -> str:
        ran.append(job.id)
        seen[job.id] = job.dependency_results()
        return job.id

    echomq.Consumer(q, handler).run(burst=True)
    return ran, seen


def _state(q: echomq.Queue, job_id: str) -> str | None:
    job = q.get(job_id)
    return None if job is None else job.state


def test_durable_a_chain_comes_back_blocked_and_runs_in_order(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("chain", redis=client, floor=floor, durability="durable")
    sched = _scheduler(client, floor, "chain")
    _tick(sched)
    a = q.add("a", {})
    b = q.add("b", {}, after=[a])
    c = q.add("c", {}, after=[b])
    rows = {r.job_id: r.fields for r in floor.open_rows("chain", None, 10)}
    assert rows[b]["state"] == "blocked" and rows[b]["after"] == a
    assert rows[c]["state"] == "blocked" and rows[c]["after"] == b
    _wipe(client, sched)
    assert [_state(q, x) for x in (a, b, c)] == ["waiting", "blocked", "blocked"]
    assert q.counts()["blocked"] == 2 and q.counts()["waiting"] == 1
    ran, seen = _run(q)
    assert ran == [a, b, c]
    assert seen[c] == {b: b}
    _tick(sched)
    assert floor.count("chain") == 0


def test_folded_blocked_jobs_survive_a_restart_like_deferred_ones(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("fold", redis=client, floor=floor)
    sched = _scheduler(client, floor, "fold")
    _tick(sched)
    a = q.add("a", {}, delay=600)
    b = q.add("b", {}, after=[a])
    c = q.add("c", {}, after=[a, b], on_dep_failure="run")
    _tick(sched)  # the fold writes the deferred and the blocked jobs' rows
    assert {r.job_id for r in floor.open_rows("fold", None, 10)} == {a, b, c}
    _wipe(client, sched)
    assert [_state(q, x) for x in (a, b, c)] == ["scheduled", "blocked", "blocked"]
    assert client.hget(q.keys.job(c), "dep_fail") == b"run"
    client.zadd(q.keys.schedule, {a: 0})  # its time comes
    scripts.promote(client, q.keys, 10)
    ran, _ = _run(q)
    assert ran == [a, b, c]
    _tick(sched)
    assert floor.count("fold") == 0


def test_a_dependency_completed_before_the_loss_counts_as_done(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("done", redis=client, floor=floor, durability="durable")
    sched = _scheduler(client, floor, "done")
    _tick(sched)
    a = q.add("a", {})
    other = q.add("other", {})
    d = q.add("d", {}, after=[a, other])
    _tick(sched)  # d's row as admitted: no dependency ended yet
    assert "dep:" + a not in floor.rows("done", [d])[0].fields
    _complete(client, q, a, '"ra"')
    _tick(sched)  # a's row closes: the floor no longer holds it
    assert a not in {r.job_id for r in floor.open_rows("done", None, 10)}
    _wipe(client, sched)
    assert q.get(a) is None and _state(q, d) == "blocked"
    ran, seen = _run(q)
    assert ran == [other, d]
    assert seen[d] == {a: "ra", other: other}  # a's result, kept on d's row


def test_folded_an_immediate_dependency_lost_with_valkey_counts_as_completed(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lost", redis=client, floor=floor)
    sched = _scheduler(client, floor, "lost")
    _tick(sched)
    a = q.add("a", {})  # immediate: Valkey only under "folded"
    b = q.add("b", {}, after=[a])
    _tick(sched)
    assert {r.job_id for r in floor.open_rows("lost", None, 10)} == {b}
    _wipe(client, sched)
    assert q.get(a) is None and _state(q, b) == "waiting"
    ran, seen = _run(q)
    assert ran == [b] and seen[b] == {a: None}


def test_a_chord_partly_completed_before_the_wipe_calls_back_once(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("chord", redis=client, floor=floor, durability="durable")
    sched = _scheduler(client, floor, "chord")
    _tick(sched)
    members = q.add_many([("m", {"i": i}) for i in range(6)])
    callback = q.add("cb", {}, after=members)
    for m in members[:3]:
        _complete(client, q, m, f'"{m}"')
    _tick(sched)
    _wipe(client, sched)
    assert _state(q, callback) == "blocked"
    assert [_state(q, m) for m in members[3:]] == ["waiting"] * 3
    ran, seen = _run(q)
    assert ran == [*members[3:], callback]
    assert ran.count(callback) == 1
    assert seen[callback] == {m: m for m in members}
    _tick(sched)
    _wipe(client, sched)  # a second loss after the callback ran brings nothing back
    assert q.get(callback) is None and _run(q)[0] == []


def test_a_dead_dependency_closes_its_dependents_rows_and_none_come_back(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("dead", redis=client, floor=floor, durability="durable")
    sched = _scheduler(client, floor, "dead")
    _tick(sched)
    a = q.add("a", {}, max_attempts=1)
    b = q.add("b", {}, after=[a])
    c = q.add("c", {}, after=[b])
    lanes = Lanes(client, q.keys, q.settings)
    [claimed] = lanes.claim(1)
    lanes.settle([Outcome(claimed.id, claimed.token, "d", "boom", 0)])
    assert [_state(q, x) for x in (a, b, c)] == ["dead"] * 3
    _tick(sched)
    assert floor.count("dead") == 0  # the dependents' rows closed with the dependency's
    _wipe(client, sched)
    assert [q.get(x) for x in (b, c)] == [None, None] and _run(q)[0] == []


def test_a_blocked_job_whose_valkey_data_is_lost_right_after_its_admit_stays_blocked(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    from echomq import durable

    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("race", redis=client, floor=floor, durability="durable")
    a = q.add("a", {})
    real = durable.MARK

    class FlushFirst:
        """A hook: Valkey loses its data between the admit and the mark."""

        def __call__(self, c: redis.Redis, keys: list[str], args: list[object]) -> object:
            c.flushall()
            return real(c, keys, args)

    monkeypatch.setattr(durable, "MARK", FlushFirst())
    b = q.add("b", {}, after=[a], on_dep_failure="run")
    monkeypatch.setattr(durable, "MARK", real)
    fields = floor.rows("race", [b])[0].fields
    assert (fields["state"], fields["after"], fields["dep_fail"]) == ("blocked", a, "run")
    sched = _scheduler(client, floor, "race")
    _tick(sched)  # the epoch is gone: rehydration
    assert [_state(q, x) for x in (a, b)] == ["waiting", "blocked"]
    assert _run(q)[0] == [a, b]


def test_a_dependency_ending_while_its_dependent_is_held_counts_once_in_the_fanin(
        server: LocalRedis) -> None:
    """Between the hold and the fan-in of a rehydration a dependency that lists the held
    job among its dependents may end: the fan-in, not that end, counts it."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("held", redis=client)
    a = q.add("a", {})
    other = q.add("other", {})
    client.hset(q.keys.job(a), "dependents", "b")  # as a row refreshed after b's admit
    row = {"id": "b", "name": "b", "payload": "{}", "lane": "default", "attempts": "0",
           "max_attempts": "3", "stalls": "0", "max_stalls": "1", "backoff": "",
           "created_ms": "1", "state": "blocked", "dep_fail": "fail",
           "after": f"{a} {other}"}
    flat = [x for kv in row.items() for x in kv]
    scripts.REBLOCK(client, [q.keys.waitdeps], [q.keys.prefix, "hold", "b", len(row), *flat])
    _complete(client, q, a, '"ra"')  # ends while b is held: not counted here
    assert client.hget(q.keys.job("b"), "state") == b"blocked"
    scripts.REBLOCK(client, [q.keys.waitdeps], [q.keys.prefix, "fanin", "b"])
    assert client.hmget(q.keys.job("b"), "state", "deps_left") == [b"blocked", b"1"]
    assert _run(q)[0] == [other, "b"]


def test_folded_a_chord_admitted_while_nobody_folded_reaches_the_floor_by_the_sweep(
        floor: Floor, server: LocalRedis) -> None:
    """Blocked jobs admitted while the fold lease had lapsed (no scheduler yet, none for a
    while, or Valkey restarted empty and the scheduler not yet back) are on no fold log: the
    next leader's sweep folds them, and their fan-in then keeps their rows current."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lapsedchord", redis=client, floor=floor)
    sched = _scheduler(client, floor, "lapsedchord")
    _tick(sched)
    client.hset(q.keys.meta, "fold", "1")  # the fold lease ran out: nobody folds
    first, second, late = q.add_many([("m", {"i": i}) for i in range(3)])
    callback = q.add("cb", {}, after=[first, second, late])
    released = q.add("r", {}, after=[first])  # released before the sweep: on its lane
    _complete(client, q, first, '"r1"')
    assert client.llen(q.keys.fold) == 0  # nothing logged: only a sweep can fold them
    _tick(sched)  # a leader again: the lapse is noticed and everything swept
    on_floor = {r.job_id for r in floor.open_rows("lapsedchord", None, 10)}
    assert {callback, released} <= on_floor
    _complete(client, q, second, '"r2"')  # its mark reaches the callback's row
    _tick(sched)
    assert floor.rows("lapsedchord", [callback])[0].fields.get(f"dep:{second}") == 'c"r2"'
    _wipe(client, sched)  # the immediate members are lost with Valkey: they count completed
    assert _state(q, callback) == "waiting" and _state(q, released) == "waiting"
    ran, seen = _run(q)
    assert sorted(ran) == sorted([callback, released]) and ran.count(callback) == 1
    assert seen[callback] == {first: "r1", second: "r2", late: None}
