"""Events of the states beyond the plain life of a job: dependencies (blocked, unblocked,
ended by a failed dependency), cancel of a running job, expiry, debounce and the floor's
restore, each written by the script that changes the state."""

from __future__ import annotations

import redis

import echomq
from echomq import durable
from echomq.events import KINDS, Event
from echomq.expiry import expire_pass, expiring_key
from echomq.lanes import Lanes, Outcome


def _events(q: echomq.Queue, job_id: str) -> list[Event]:
    return [ev for ev in q.events(block_s=0) if ev.job_id == job_id]


def _kinds(q: echomq.Queue, job_id: str) -> list[tuple[str, dict[str, str]]]:
    return [(ev.kind, dict(ev.data)) for ev in _events(q, job_id)]


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def test_the_new_kinds_are_listed() -> None:
    assert {"blocked", "gathered"} <= set(KINDS)


def test_a_dependent_is_blocked_then_unblocked_after_its_dependency_completed(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    a = q.add("a", None, lane="x")
    c = q.add("c", None, lane="y", after=[a])
    assert _kinds(q, c) == [("blocked", {})]
    lanes = _lanes(q)
    [job] = lanes.claim(1)
    assert job.id == a
    lanes.settle([Outcome(job.id, job.token, "c", "1")])
    assert _kinds(q, c) == [("blocked", {}), ("waiting", {"reason": "unblocked"})]
    assert _events(q, c)[-1].lane == "y"
    order = [(ev.job_id, ev.kind) for ev in q.events(block_s=0)]
    assert order.index((a, "completed")) < order.index((c, "waiting"))  # in causal order
    # a job whose dependencies ended already is admitted straight to its lane
    d = q.add("d", None, after=[a])
    assert _kinds(q, d) == [("added", {})]


def test_a_dependent_ended_by_a_dead_dependency_is_dead_with_the_reason(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    a = q.add("a", None, max_attempts=1)
    c = q.add("c", None, after=[a])
    e = q.add("e", None, after=[c])  # down the graph
    lanes = _lanes(q)
    [job] = lanes.claim(1)
    lanes.settle([Outcome(job.id, job.token, "f", "boom", 0)])
    assert _kinds(q, c)[-1] == ("dead", {"reason": f"dependency {a} dead"})
    assert _kinds(q, e)[-1] == ("dead", {"reason": f"dependency {c} dead"})
    # admitted after its dependency died: added, then dead at once
    late = q.add("late", None, after=[a])
    assert _kinds(q, late) == [("added", {}), ("dead", {"reason": f"dependency {a} dead"})]


def test_a_running_job_cancelled_is_one_cancelled_event(redis_url: str,
                                                        queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", {}, lane="l")
    [c] = _lanes(q).claim(1)
    assert q.cancel(jid) is True
    assert _kinds(q, jid) == [("added", {}), ("started", {}),
                              ("cancelled", {"reason": "cancelled while running"})]
    assert q.cancel(jid) is False
    assert len(_events(q, jid)) == 3  # a refused cancel writes nothing


def test_expiry_at_claim_and_in_the_pass_is_cancelled_expired(redis_url: str, queue_name: str,
                                                              r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    at_claim = q.add("x", 1, expires=60)
    in_pass = q.add("x", 2, delay=60, expires=3600)
    for jid in (at_claim, in_pass):
        r.hset(q.keys.job(jid), "expires_ms", 1)
        r.zadd(expiring_key(q.keys), {jid: 1})
    assert _lanes(q).claim(1) == []
    assert _kinds(q, at_claim)[-1] == ("cancelled", {"reason": "expired"})
    assert "started" not in [k for k, _ in _kinds(q, at_claim)]
    assert expire_pass(q.redis, q.keys)[0] == 1
    assert _kinds(q, in_pass)[-1] == ("cancelled", {"reason": "expired"})


def test_a_debounced_add_opens_a_job_then_gathers_into_it(redis_url: str,
                                                          queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("s", {"n": 1}, debounce="k", debounce_s=30, debounce_max_s=600)
    assert q.add("s", {"n": 2}, debounce="k", debounce_s=30, debounce_max_s=600) == jid
    [added, gathered] = _events(q, jid)
    assert (added.kind, gathered.kind) == ("added", "gathered")
    assert int(gathered.data["due_ms"]) >= int(added.data["due_ms"])
    job = q.get(jid)
    assert job is not None
    assert int(gathered.data["due_ms"]) == int(q.redis.hget(q.keys.job(jid), "due_ms") or 0)


def test_a_job_restored_from_the_floor_is_waiting_restored(redis_url: str, queue_name: str,
                                                           r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    fields = {"id": "lost", "name": "x", "payload": "{}", "lane": "l", "attempts": "0",
              "max_attempts": "3", "stalls": "0", "max_stalls": "1", "backoff": "0",
              "created_ms": "1"}
    args: list[str | int] = [q.keys.prefix, "lost", len(fields)]
    for k, v in fields.items():
        args += [k, v]
    assert durable.REQUEUE(r, durable.requeue_keys(q.keys), args) == [1]
    assert _kinds(q, "lost") == [("waiting", {"reason": "restored"})]
    assert durable.REQUEUE(r, durable.requeue_keys(q.keys), args) == [0]
    assert len(_events(q, "lost")) == 1  # a job already there is left alone, silently


def test_events_off_writes_none_of_the_new_kinds(redis_url: str, queue_name: str,
                                                 r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_events(False)
    a = q.add("a", None)
    q.add("c", None, after=[a])
    q.add("s", 1, debounce="k", debounce_s=30)
    assert r.xlen(q.keys.events) == 0
