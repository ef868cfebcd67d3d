"""Lanes.claim fairness, lease tokens, settle, extend, reap, retries, dead jobs, retention."""

from __future__ import annotations

import math
import time

import pytest
import redis

import echomq
from echomq import scripts
from echomq.keys import Keys
from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled


def _lanes(q: echomq.Queue, **overrides: object) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings.with_overrides(**overrides))


def test_round_robin_lane_fairness(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i, {"lane": "big"}) for i in range(10_000)])
    q.add("x", "a", lane="small-a")
    q.add("x", "b", lane="small-b")
    lanes = _lanes(q)
    order = [c.lane for c in lanes.claim(3)]
    assert sorted(order) == ["big", "small-a", "small-b"]  # one claim turn per lane
    # the small lanes are done and left the ring; the big one is alone now
    assert [c.lane for c in lanes.claim(5)] == ["big"] * 5
    assert q.stats()["lanes"] == 1


def test_claim_order_alternates_between_lanes(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i, {"lane": "a"}) for i in range(100)])
    q.add_many([("x", i, {"lane": "b"}) for i in range(3)])
    lanes = _lanes(q)
    order = [lanes.claim(1)[0].lane for _ in range(8)]
    assert order == ["a", "b", "a", "b", "a", "b", "a", "a"]
    assert [c.payload_text for c in lanes.claim(2)] == ["5", "6"]  # FIFO inside a lane


def test_claim_sets_active_attempts_and_lease(redis_url: str, queue_name: str,
                                              r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"k": 1})
    [c] = _lanes(q).claim(10)
    assert (c.id, c.attempts, c.name) == (job_id, 1, "x")
    job = q.get(job_id)
    assert job is not None and job.state == "active" and job.attempts == 1
    score = r.zscore(Keys(queue_name).leases, job_id)
    server_ms = int(r.time()[0]) * 1000
    assert score is not None and 25_000 < score - server_ms <= 31_000
    assert _lanes(q).claim(1) == []


def test_stale_token_settle_is_refused(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", 1)
    lanes = _lanes(q, lease_ms=100)
    [first] = lanes.claim(1)
    r = q.redis
    r.zadd(q.keys.leases, {job_id: 0})  # the lease ran out
    assert scripts.reap(r, q.keys)[0] == 1
    [second] = lanes.claim(1)
    assert second.token != first.token and second.attempts == 2
    assert lanes.settle([Outcome(job_id, first.token, "c")]) == [Settled.STALE]
    assert q.get(job_id).state == "active"  # type: ignore[union-attr]
    assert lanes.settle([Outcome(job_id, second.token, "c")]) == [Settled.COMPLETED]
    assert lanes.settle([Outcome(job_id, second.token, "c")]) == [Settled.STALE]
    assert q.counts()["completed"] == 1


def test_retry_with_backoff_then_dead(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", 1, max_attempts=3)
    lanes = _lanes(q)
    for attempt in (1, 2):
        [c] = lanes.claim(1)
        assert c.attempts == attempt
        before = int(r.time()[0]) * 1000
        assert lanes.settle([Outcome(c.id, c.token, "f", "boom", 5_000)]) == [Settled.RETRYING]
        job = q.get(job_id)
        assert job is not None and job.state == "scheduled" and job.error == "boom"
        assert 4_000 <= (job.due_ms or 0) - before <= 6_500
        r.zadd(q.keys.schedule, {job_id: 0})  # let the clock pass the backoff
        assert scripts.promote(r, q.keys, 100)[0] == 1
    [c] = lanes.claim(1)
    assert lanes.settle([Outcome(c.id, c.token, "f", "final boom", 5_000)]) == [Settled.DEAD]
    job = q.get(job_id)
    assert job is not None and job.state == "dead" and job.error == "final boom"
    assert q.counts()["dead"] == 1 and q.stats()["retried"] == 2


def test_consumer_backoff_doubles(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", 1, max_attempts=5, backoff=echomq.Backoff(base=10, jitter=0))
    dues = []

    def fail(job: echomq.Job) -> None:
        raise RuntimeError(f"attempt {job.attempts}")

    c = echomq.Consumer(q, fail)
    for _ in range(3):
        start = int(q.redis.time()[0]) * 1000 + int(q.redis.time()[1]) // 1000
        c.run(burst=True)
        job = q.get(job_id)
        assert job is not None and job.state == "scheduled"
        dues.append((job.due_ms or 0) - start)
        q.redis.zadd(q.keys.schedule, {job_id: 0})
    assert [round(d / 1000) for d in dues] == [10, 20, 40]
    assert "attempt 3" in (q.get(job_id).error or "")  # type: ignore[union-attr]


def test_dead_jobs_keep_traceback_and_can_be_retried(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"n": 1}, max_attempts=1)

    def fail(job: echomq.Job) -> None:
        raise KeyError("missing-thing")

    echomq.Consumer(q, fail).run(burst=True)
    [dead] = q.dead()
    assert dead.id == job_id and "Traceback" in (dead.error or "") and "missing-thing" in dead.error
    assert q.retry_dead([job_id]) == 1
    assert q.counts()["dead"] == 0
    results = []
    echomq.Consumer(q, lambda job: results.append(job.attempts)).run(burst=True)
    assert results == [1]
    assert q.get(job_id).state == "completed"  # type: ignore[union-attr]


def test_extend_keeps_a_lease_alive(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", 1)
    lanes = _lanes(q, lease_ms=60_000)
    [c] = lanes.claim(1)
    q.redis.zadd(q.keys.leases, {c.id: 1})
    assert lanes.extend([(c.id, c.token), (c.id, "999999")]) == [True, False]
    assert scripts.reap(q.redis, q.keys)[:2] == (0, 0)


def test_reap_returns_expired_leases_to_the_front_then_dead(redis_url: str,
                                                            queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_stalls=1)
    first = q.add("x", 1)
    q.add("x", 2)
    lanes = _lanes(q, lease_ms=100)
    [c] = lanes.claim(1)
    assert c.id == first
    requeued, buried, next_expiry, _ = scripts.reap(q.redis, q.keys)
    assert (requeued, buried, next_expiry) == (0, 0, next_expiry) and next_expiry > 0
    q.redis.zadd(q.keys.leases, {first: 0})  # its lease ran out
    assert scripts.reap(q.redis, q.keys)[:2] == (1, 0)
    job = q.get(first)
    assert job is not None and job.state == "waiting" and job.stalls == 1
    [again] = lanes.claim(1)
    assert again.id == first  # back at the front of its lane
    q.redis.zadd(q.keys.leases, {first: 0})
    assert scripts.reap(q.redis, q.keys)[:2] == (0, 1)
    job = q.get(first)
    assert job is not None and job.state == "dead" and "stalled 2 times" in (job.error or "")


def test_a_deferred_job_handed_back_is_logged_for_the_floor_while_the_queue_folds(
        redis_url: str, queue_name: str) -> None:
    # release and reap put a job back on its lane; one that was deferred is appended to
    # the fold log while a scheduler's fold lease holds, an immediate one never, and
    # nothing is appended once the lease ran out
    q = echomq.Queue(queue_name, redis_url=redis_url)
    r = q.redis
    now_ms = int(r.time()[0]) * 1000
    r.hset(q.keys.meta, "fold", now_ms + 60_000)  # a scheduler's fold lease holds
    deferred = q.add("d", {}, delay=600)
    r.zadd(q.keys.schedule, {deferred: 0})
    assert scripts.promote(r, q.keys, 10)[0] == 1
    q.add("x", {})  # immediate
    r.delete(q.keys.fold)  # the schedule script logged the deferred one as it was added
    lanes = _lanes(q)
    held = lanes.claim(2)
    assert lanes.release([(c.id, c.token) for c in held], "unstarted") == (2, 0)
    assert [x.decode() for x in r.lrange(q.keys.fold, 0, -1)] == [deferred]
    held = lanes.claim(2)
    r.zadd(q.keys.leases, {c.id: 0 for c in held})  # both leases lapsed
    assert scripts.reap(r, q.keys)[:2] == (2, 0)
    assert [x.decode() for x in r.lrange(q.keys.fold, 0, -1)] == [deferred] * 2
    r.hset(q.keys.meta, "fold", now_ms - 1)  # no scheduler folds any more
    held = lanes.claim(2)
    assert lanes.release([(c.id, c.token) for c in held], "requeue") == (2, 0)
    assert r.llen(q.keys.fold) == 2


def test_release_modes(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    a, b = q.add("x", 1), q.add("x", 2)
    lanes = _lanes(q)
    ca, cb = lanes.claim(2)
    assert lanes.release([(ca.id, ca.token)], "unstarted") == (1, 0)
    assert lanes.release([(cb.id, "bogus")], "stall") == (0, 0)
    assert lanes.release([(cb.id, cb.token)], "requeue") == (1, 0)
    ja, jb = q.get(a), q.get(b)
    assert ja is not None and jb is not None
    assert (ja.state, ja.attempts, ja.stalls) == ("waiting", 0, 0)
    assert (jb.state, jb.attempts, jb.stalls) == ("waiting", 1, 0)


def test_promote_in_batches_of_pump_batch(redis_url: str, queue_name: str,
                                          r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i, {"delay": 3600}) for i in range(250)])
    r.zadd(q.keys.schedule, {m: 1 for m in r.zrange(q.keys.schedule, 0, -1)})
    assert scripts.promote(r, q.keys, 100)[0] == 100
    assert scripts.promote(r, q.keys, 100)[0] == 100
    promoted, next_due, _ = scripts.promote(r, q.keys, 100)
    assert (promoted, next_due) == (50, -1)
    assert q.counts()["waiting"] == 250 and q.counts()["scheduled"] == 0


def test_retention_bounds_completed_jobs(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=5)
    ids = q.add_many([("x", i) for i in range(20)])
    echomq.Consumer(q, lambda job: job.payload * 2).run(burst=True)
    assert q.counts()["completed"] == 20
    assert r.zcard(q.keys.completed) == 5
    kept = [q.get(i) for i in ids]
    assert sum(1 for j in kept if j is not None) == 5
    assert all(j.result == j.payload * 2 and j.state == "completed" for j in kept if j)
    q0 = echomq.Queue(queue_name + "-drop", redis_url=redis_url, keep_completed=0)
    job_id = q0.add("x", 1)
    echomq.Consumer(q0, lambda job: None).run(burst=True)
    assert q0.get(job_id) is None and q0.counts()["completed"] == 1


def test_chained_claim_rings_only_while_work_remains(redis_url: str, queue_name: str,
                                                     r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(3)])
    r.delete(q.keys.wake)
    lanes = _lanes(q)
    lanes.claim(1)
    assert r.llen(q.keys.wake) == 0  # without chain: no ring
    lanes.claim(1, chain=True)
    assert r.llen(q.keys.wake) == 1  # one job left: the next parked consumer is woken
    r.delete(q.keys.wake)
    lanes.claim(1, chain=True)
    assert r.llen(q.keys.wake) == 0  # nothing left: nobody else needs waking


def test_a_delayed_job_is_never_due_early(redis_url: str, queue_name: str,
                                          r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    for _ in range(20):
        sec, usec = r.time()
        job = q.get(q.add("x", delay=0.3))
        assert job is not None and job.due_ms is not None
        assert job.due_ms >= sec * 1000 + usec / 1000 + 300


def test_a_delayed_jobs_due_time_keeps_the_server_clocks_microseconds(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """The score is the server clock at the admit plus the delay, to the microsecond (not
    rounded up to the next ms, which made a job start up to a ms late); the hash's due_ms,
    which the floor keeps, is that time rounded up, so a restored job never starts early."""
    q = echomq.Queue(queue_name, redis_url=redis_url)

    def server_ms() -> float:
        sec, usec = r.time()
        return sec * 1000 + usec / 1000

    for _ in range(10):
        before = server_ms()
        job_id = q.add("x", delay=0.3)
        after = server_ms()
        score = r.zscore(q.keys.schedule, job_id)
        assert before + 300 <= score <= after + 300
        assert int(r.hget(q.keys.job(job_id), "due_ms")) == math.ceil(score)


def test_promote_judges_a_due_time_to_the_microsecond(redis_url: str, queue_name: str,
                                                      r: redis.Redis) -> None:
    """Between a due time and the next whole ms, the job is due: a promote then moves it,
    and the next due time it returns before that is the score itself, to the microsecond
    (the metronome's timer aims at it)."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    for _ in range(5):
        job_id = q.add("x", delay=3600)
        sec, usec = r.time()
        due = math.floor(sec * 1000 + usec / 1000) + 3.5  # half past a whole ms
        r.zadd(q.keys.schedule, {job_id: due}, xx=True)
        deadline = time.monotonic() + 5
        while True:
            promoted, next_due, server_now = scripts.promote(r, q.keys, 10)
            if promoted:
                assert server_now >= due
                break
            assert server_now < due, "due, yet not promoted"
            assert next_due == pytest.approx(due, abs=0.001)
            assert time.monotonic() < deadline
        [claimed] = _lanes(q).claim(1)
        assert claimed.id == job_id


def test_a_delayed_job_starts_no_earlier_than_the_ms_before_its_due_ms(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """Job.due_ms is the due time rounded up: the job may start in the ms before it (its
    started_ms, rounded down, one below), never earlier, and never before its score."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    lanes = _lanes(q)
    for _ in range(20):
        job_id = q.add("x", delay=0.003)
        score = r.zscore(q.keys.schedule, job_id)
        deadline = time.monotonic() + 5
        while True:
            promoted, _, server_now = scripts.promote(r, q.keys, 10)
            if promoted:
                break
            assert time.monotonic() < deadline
        assert server_now >= score
        [claimed] = lanes.claim(1)
        job = q.get(claimed.id)
        assert job is not None and job.due_ms is not None and job.started_ms is not None
        assert job.started_ms >= job.due_ms - 1


def test_an_empty_token_never_matches_a_settled_job(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", 1)
    lanes = _lanes(q)
    [c] = lanes.claim(1)
    assert lanes.settle([Outcome(c.id, c.token, "c")]) == [Settled.COMPLETED]
    assert lanes.settle([Outcome(job_id, "", "c")]) == [Settled.STALE]
    assert lanes.release([(job_id, "")], "stall") == (0, 0)
    assert lanes.extend([(job_id, "")]) == [False]
    job = q.get(job_id)
    assert job is not None and job.state == "completed" and job.token is None


def test_tokens_of_one_batch_are_distinct_and_fresh(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(40)])
    lanes = _lanes(q)
    tokens = [c.token for _ in range(3) for c in lanes.claim(16)]
    assert len(tokens) == 40 and len(set(tokens)) == 40


def test_released_jobs_go_back_to_the_lane_head_in_their_order(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(6)])
    lanes = _lanes(q)
    batch = lanes.claim(4)
    assert lanes.release([(c.id, c.token) for c in batch], "unstarted") == (4, 0)
    assert [c.payload_text for c in lanes.claim(6)] == ["0", "1", "2", "3", "4", "5"]


def test_a_pair_released_twice_in_one_call_goes_back_once(redis_url: str,
                                                          queue_name: str) -> None:
    # every token is checked before any job is handed back: a repeated pair must not put
    # its id on the lane twice (two claims of one job: it would run twice)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(2)])
    lanes = _lanes(q)
    a, b = lanes.claim(2)
    pairs = [(a.id, a.token), (b.id, b.token), (a.id, a.token)]
    assert lanes.release(pairs, "unstarted") == (2, 0)
    assert sorted(c.id for c in lanes.claim(10)) == sorted([a.id, b.id])
    assert q.counts()["waiting"] == 0


def test_restore_leaves_a_job_in_valkey_alone(redis_url: str, queue_name: str,
                                              r: redis.Redis) -> None:
    # a second replica re-applying the floor rows of an interrupted rehydration must not
    # reset a job that is already back and running: it would run twice
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"n": 1})
    (claimed,) = _lanes(q).claim(1)
    args = [q.keys.prefix, "rehydrate", job_id, 0, 2, "name", "x", "payload", '{"n":1}']
    assert scripts.RESTORE(r, [q.keys.schedule, q.keys.wake, q.keys.spilled], args) == [0]
    job = q.get(job_id)
    assert job is not None and job.state == "active"
    assert r.hget(q.keys.job(job_id), "token").decode() == claimed.token
    assert r.zscore(q.keys.schedule, job_id) is None


def test_spill_leaves_a_job_whose_due_time_moved_since_the_floor_wrote_it(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {}, delay=7200)
    due = int(r.hget(q.keys.job(job_id), "due_ms"))  # what the floor's row holds
    keys = [q.keys.schedule, q.keys.spilled]
    # the floor's row says another due time: the job was retried or re-added meanwhile
    assert scripts.SPILL(r, keys, [q.keys.prefix, "schedule", job_id, due - 1]) == [0]
    assert r.exists(q.keys.job(job_id)) and math.ceil(r.zscore(q.keys.schedule, job_id)) == due
    assert not r.sismember(q.keys.spilled, job_id)
    assert scripts.SPILL(r, keys, [q.keys.prefix, "schedule", job_id, due]) == [1]
    assert r.sismember(q.keys.spilled, job_id)
    stub = r.hgetall(q.keys.job(job_id))  # a stub stays, without the payload
    assert stub[b"spilled"] == b"1" and stub[b"state"] == b"scheduled" and b"payload" not in stub


def test_progress_with_a_stale_token_changes_nothing(redis_url: str, queue_name: str,
                                                     r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", 1)
    lanes = _lanes(q, lease_ms=60_000)
    [first] = lanes.claim(1)
    assert lanes.progress(job_id, first.token, {"step": 1})
    q.redis.zadd(q.keys.leases, {job_id: 0})  # its lease ran out: reaped, claimed again
    assert scripts.reap(q.redis, q.keys)[0] == 1
    [second] = lanes.claim(1)
    q.redis.zadd(q.keys.leases, {job_id: 5})
    assert not lanes.progress(job_id, first.token, {"step": 2})
    job = q.get(job_id)
    assert job is not None and job.progress == {"step": 1}
    assert r.zscore(q.keys.leases, job_id) == 5  # the new holder's lease is untouched
    assert lanes.progress(job_id, second.token, {"step": 3})


def test_a_single_claim_keeps_the_waiting_counter_exact(redis_url: str,
                                                        queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(3)])
    lanes = _lanes(q)
    for _ in range(3):
        assert len(lanes.claim(1)) == 1
        assert scripts.counts(q.redis, q.keys, fast=True) == scripts.counts(q.redis, q.keys)


def test_cancel_tells_a_running_job_from_a_finished_one(redis_url: str,
                                                        queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    running, finished = q.add("x", 1), q.add("x", 2)
    lanes = _lanes(q)
    first, second = lanes.claim(2)
    lanes.settle([Outcome(second.id, second.token, "c", "", 0)])
    assert scripts.cancel(q.redis, q.keys, running) is scripts.Cancelled.ACTIVE
    assert scripts.cancel(q.redis, q.keys, finished) is scripts.Cancelled.FINISHED
    job = q.get(running)
    assert job is not None and job.state == "active"
