"""Property: any interleaving of add / claim / settle / reap / promote keeps every job in
exactly one state, and the structures agree with the job hashes."""

from __future__ import annotations

import uuid

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import echomq
from echomq import scripts
from echomq.lanes import Lanes, Outcome

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(["a", "b", "c"]), st.booleans()),
        st.tuples(st.just("claim"), st.integers(1, 4)),
        st.tuples(st.just("settle"), st.sampled_from(["c", "f", "d"]), st.booleans()),
        st.tuples(st.just("expire")),
        st.tuples(st.just("reap")),
        st.tuples(st.just("promote")),
    ),
    max_size=40,
)


def _state_of(r: redis.Redis, q: echomq.Queue, job_id: str, lanes: list[str]) -> set[str]:
    k = q.keys
    where = set()
    if any(job_id.encode() in r.lrange(k.lane(lane), 0, -1) for lane in lanes):
        where.add("waiting")
    if r.zscore(k.schedule, job_id) is not None:
        where.add("scheduled")
    if r.zscore(k.leases, job_id) is not None:
        where.add("active")
    if r.zscore(k.completed, job_id) is not None:
        where.add("completed")
    if r.zscore(k.dead, job_id) is not None:
        where.add("dead")
    return where


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_every_job_is_in_exactly_one_state(redis_url: str, ops: list[tuple]) -> None:
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(f"p-{uuid.uuid4().hex[:10]}", redis=r, keep_completed=None,
                     keep_completed_s=None)
    lanes = Lanes(r, q.keys, q.settings)
    held: list[tuple[str, str]] = []
    ids: list[str] = []
    for op in ops:
        if op[0] == "add":
            ids.append(q.add("x", 1, lane=op[1], delay=5 if op[2] else None, max_attempts=2))
        elif op[0] == "claim":
            held += [(c.id, c.token) for c in lanes.claim(op[1])]
        elif op[0] == "settle" and held:
            job_id, token = held.pop(0 if op[2] else -1)
            lanes.settle([Outcome(job_id, token, op[1], "err", 1000)])
        elif op[0] == "expire":
            for job_id in r.zrange(q.keys.leases, 0, -1):
                r.zadd(q.keys.leases, {job_id: 0})
        elif op[0] == "reap":
            scripts.reap(r, q.keys)
        elif op[0] == "promote":
            for job_id in r.zrange(q.keys.schedule, 0, -1):
                r.zadd(q.keys.schedule, {job_id: 0})
            scripts.promote(r, q.keys, 100)
    for job_id in ids:
        where = _state_of(r, q, job_id, ["a", "b", "c"])
        assert len(where) == 1, (job_id, where)
        job = q.get(job_id)
        assert job is not None and {job.state} == where
    ring = [x.decode() for x in r.lrange(q.keys.ring, 0, -1)]
    assert len(ring) == len(set(ring))
    assert set(ring) == {lane for lane in "abc" if r.llen(q.keys.lane(lane)) > 0}
    counts = q.counts()
    assert counts["waiting"] + counts["scheduled"] + counts["active"] + r.zcard(
        q.keys.completed) + counts["dead"] == len(ids)
    r.close()
