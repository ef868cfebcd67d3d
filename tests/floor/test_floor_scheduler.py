"""The scheduler on both floors: rehydration after Valkey loses its data, spill and restore,
two schedulers on one queue, a floor outage during folding."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import redis
import sqlalchemy as sa
from beats import tick as _tick
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq import scripts
from echomq.floor import Floor
from echomq.job import Claimed
from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled

HOUR_MS = 3_600_000


def _scheduler(client: redis.Redis, floor: Floor, queue: str, **kw: object) -> Scheduler:
    s = Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600, **kw)  # type: ignore[arg-type]
    client.hset(f"emq:{{{queue}}}:meta", "fold", "1")
    return s


def _run_all(q: echomq.Queue, ran: Counter[str]) -> None:
    def handler(job: echomq.Job) -> None:
        ran[job.id] += 1

    q.redis.zadd(q.keys.schedule, {m: 0 for m in q.redis.zrange(q.keys.schedule, 0, -1)})
    echomq.Consumer(q, handler, pump_batch=1000).run(burst=True)


def test_deferred_and_retrying_jobs_survive_valkey_restarting_empty(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("rehydrate", redis=client)
    sched = _scheduler(client, floor, "rehydrate")
    _tick(sched)  # takes the lead and sets the epoch
    delayed = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(1000)])
    retrying = q.add_many([("r", {"i": i}) for i in range(1000)])
    lanes = Lanes(client, q.keys, q.settings)
    claimed = lanes.claim(1000)
    assert len(claimed) == 1000
    lanes.settle([Outcome(c.id, c.token, "f", "transient", 600_000) for c in claimed])
    assert q.counts()["scheduled"] == 2000
    _tick(sched)  # folds all 2000 within one beat
    assert floor.count("rehydrate") == 2000
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("rehydrate", redis=client2, keep_completed=None)
    assert q2.counts()["scheduled"] == 0
    sched2 = _scheduler(client2, floor, "rehydrate")
    _tick(sched2)
    _tick(sched2)  # a second rehydration pass creates nothing twice
    assert q2.counts()["scheduled"] == 2000
    ran: Counter[str] = Counter()
    _run_all(q2, ran)
    assert set(ran) == set(delayed) | set(retrying) and set(ran.values()) == {1}
    job = q2.get(retrying[0])
    assert job is not None and job.attempts == 2  # the retry kept its history
    _tick(sched2)  # closes the rows of the completed jobs
    assert floor.count("rehydrate") == 0


def test_spill_moves_far_jobs_out_of_valkey_and_restores_them(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("spill", redis=client)
    sched = _scheduler(client, floor, "spill")
    _tick(sched)
    before = client.info("memory")["used_memory"]
    ids = q.add_many([("far", {"i": i, "note": "x" * 100}, {"delay": 7200})
                      for i in range(10_000)])
    near = q.add("near", {}, delay=60)
    grown = client.info("memory")["used_memory"] - before
    _tick(sched)
    assert q.stats()["spilled"] == 10_000 and q.counts()["scheduled"] == 10_001
    assert client.zcard(q.keys.schedule) == 1 and client.exists(q.keys.job(near))
    stub = client.hgetall(q.keys.job(ids[0]))
    assert stub[b"spilled"] == b"1" and b"payload" not in stub
    after = client.info("memory")["used_memory"] - before
    # what stays is a stub of each job (its small fields, no payload: ~300 bytes) and its
    # id in the spilled set (~50 bytes); this payload is small (~110 bytes), so the job
    # was not much more (bench/spill_memory.py: ~1,650 -> 354 bytes with 1 KiB payloads)
    assert after < grown * 0.8, (grown, after)
    assert floor.count("spill", spilled=True) == 10_000
    sched.clock_offset_ms = 2 * HOUR_MS  # the clock moves on two hours
    _tick(sched)
    assert q.stats()["spilled"] == 0 and client.zcard(q.keys.schedule) == 10_001
    ran: Counter[str] = Counter()
    horizon_now = int(client.time()[0]) * 1000 + 1000
    due_now = client.zrangebyscore(q.keys.schedule, "-inf", horizon_now)
    assert len(due_now) == 10_000  # restored at their due time on the moved clock
    _run_all(q, ran)
    assert set(ids) <= set(ran) and set(ran.values()) == {1}


def test_two_schedulers_never_duplicate_a_restore(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("two", redis=client)
    a, b = _scheduler(client, floor, "two"), _scheduler(client, floor, "two")
    _tick(a)
    _tick(b)
    assert a.fence is not None and b.fence is None  # one leader
    q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(300)])
    _tick(a)
    client.flushall()
    client.hset(q.keys.meta, "fold", "1")
    for s in (a, b):
        s.budget_end = float("inf")  # each does the whole rehydration in one go
    threads = [threading.Thread(target=s._rehydrate, args=(0, "")) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert client.zcard(q.keys.schedule) == 300
    ran: Counter[str] = Counter()
    _run_all(q, ran)
    assert len(ran) == 300 and set(ran.values()) == {1}


def test_floor_outage_during_folding_loses_and_duplicates_nothing(
        floor: Floor, floor_url: str, backend: str, server: LocalRedis,
        pg_admin_or_none: sa.Engine | None) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("outage", redis=client)
    sched = _scheduler(client, floor, "outage")
    _tick(sched)
    first = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(200)])
    with _outage(backend, floor_url, pg_admin_or_none):
        second = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(200)])
        _tick(sched)
        assert sched.snapshot()["floor"].startswith("down")
        assert client.llen(q.keys.fold) == 400  # kept in Valkey until the floor answers
    _tick(sched)
    assert sched.snapshot()["floor"] == "ok" and client.llen(q.keys.fold) == 0
    assert floor.count("outage") == 400
    ran: Counter[str] = Counter()
    _run_all(q, ran)
    assert set(ran) == set(first) | set(second) and set(ran.values()) == {1}


class _outage:
    """Make the floor refuse work: a SQLite exclusive lock, or PostgreSQL refusing connections."""

    def __init__(self, backend: str, url: str, admin: sa.Engine | None) -> None:
        self.backend, self.url, self.admin = backend, url, admin

    def __enter__(self) -> None:
        if self.backend == "sqlite":
            import sqlite3

            self.conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=1)
            self.conn.execute("BEGIN EXCLUSIVE")
        else:
            assert self.admin is not None
            self.db = sa.make_url(self.url).database
            with self.admin.connect() as c:
                c.execute(sa.text(f'ALTER DATABASE "{self.db}" ALLOW_CONNECTIONS false'))
                c.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :d"), {"d": self.db})

    def __exit__(self, *exc: object) -> None:
        if self.backend == "sqlite":
            self.conn.rollback()
            self.conn.close()
        else:
            assert self.admin is not None
            with self.admin.connect() as c:
                c.execute(sa.text(f'ALTER DATABASE "{self.db}" ALLOW_CONNECTIONS true'))


@pytest.fixture
def pg_admin_or_none(backend: str, request: pytest.FixtureRequest) -> sa.Engine | None:
    return request.getfixturevalue("pg_admin") if backend == "postgresql" else None


def test_sync_dial_writes_the_floor_before_add_returns(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sync", redis=client, floor=floor, durability="sync")
    job_id = q.add("d", {"i": 1}, delay=600)
    [row] = floor.open_rows("sync", None, 10)
    assert row.job_id == job_id and row.fields["state"] == "scheduled"
    q.add_many([("d", {"i": i}, {"delay": 60}) for i in range(50)] + [("now", {})])
    assert floor.count("sync") == 51  # deferred ones only
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    sched = _scheduler(client2, floor, "sync")
    _tick(sched)
    assert echomq.Queue("sync", redis=client2).counts()["scheduled"] == 51


def test_jobs_scheduled_before_any_scheduler_are_swept_onto_the_floor(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("early", redis=client)
    ids = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(2500)])
    assert client.llen(q.keys.fold) == 0  # nobody had asked for folding yet
    sched = _scheduler(client, floor, "early")
    for _ in range(3):  # a batch per beat
        _tick(sched)
    assert {r.job_id for r in floor.open_rows("early", None, 10_000)} == set(ids)


def test_leadership_is_renewed_while_the_floor_backs_off(
        floor: Floor, floor_url: str, backend: str, server: LocalRedis,
        pg_admin_or_none: sa.Engine | None) -> None:
    client = redis.Redis.from_url(server.url)
    sched = _scheduler(client, floor, "lease")
    _tick(sched)
    echomq.Queue("lease", redis=client).add("d", {}, delay=600)
    with _outage(backend, floor_url, pg_admin_or_none):
        sched.tick(0.0)  # fails and backs off
        assert sched.snapshot()["floor"].startswith("down") and sched.floor_retry_at > 0
        client.pexpire(sched.keys.leader, 50)
        sched.tick(0.01)  # inside the backoff: renews the lease only
        assert client.pttl(sched.keys.leader) > 1000 and sched.fence is not None


def test_a_retried_job_promoted_while_the_fold_lease_had_lapsed_survives_valkey_loss(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("lapsed", redis=client)
    sched = _scheduler(client, floor, "lapsed")
    _tick(sched)  # takes the lead and sets the epoch
    client.hset(q.keys.meta, "fold", "1")  # the fold lease ran out: no scheduler meanwhile
    job_id = q.add("r", {})
    lanes = Lanes(client, q.keys, q.settings)
    [claimed] = lanes.claim(1)
    lanes.settle([Outcome(claimed.id, claimed.token, "f", "transient", 0)])
    assert q.get(job_id).state == "scheduled"  # type: ignore[union-attr]
    assert scripts.promote(client, q.keys, 100)[0] == 1  # due at once: waiting again
    _tick(sched)  # a leader again: the lapse is noticed and the schedule set swept
    _tick(sched)
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("lapsed", redis=client2)
    sched2 = _scheduler(client2, floor, "lapsed")
    _tick(sched2)  # rehydrates from the floor
    job = q2.get(job_id)
    assert job is not None, "a retried job was lost with Valkey's data"
    sched2.close()
    sched.close()


def test_a_job_folded_while_counted_against_its_lane_limit_is_not_uncounted_after_restore(
        floor: Floor, server: LocalRedis) -> None:
    # a retry promoted and claimed before the next fold is folded while active, its hash
    # marked "held" (counted against the lane's max_active); after Valkey loses its data the
    # row comes back with that mark, although nothing counts the job any more
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("heldfold", redis=client)
    sched = _scheduler(client, floor, "heldfold")
    _tick(sched)  # takes the lead and sets the epoch
    q.set_lane_limit("a", max_active=2)
    ids = q.add_many([("x", i, {"lane": "a"}) for i in range(2)])
    lanes = Lanes(client, q.keys, q.settings)
    claimed = lanes.claim(2)
    lanes.settle([Outcome(c.id, c.token, "f", "transient", 0) for c in claimed])
    assert scripts.promote(client, q.keys, 100)[0] == 2
    assert {c.id for c in lanes.claim(2)} == set(ids)  # active again, counted: "held" 1
    _tick(sched)  # folds both as they are now
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("heldfold", redis=client2)
    sched2 = _scheduler(client2, floor, "heldfold")
    _tick(sched2)  # rehydrates: both come back
    client2.zadd(q2.keys.schedule, {j: 0 for j in ids})
    assert scripts.promote(client2, q2.keys, 100)[0] == 2
    lanes2 = Lanes(client2, q2.keys, q2.settings)
    again = lanes2.claim(2)  # no limit recorded now: nothing counted
    assert lanes2.settle([Outcome(c.id, c.token, "c") for c in again]) == [
        Settled.COMPLETED] * 2
    assert int(client2.hget(q2.keys.active, "a") or 0) == 0  # nothing was counted
    q2.set_lane_limit("a", max_active=1)  # the limit recorded again
    q2.add_many([("x", i, {"lane": "a"}) for i in range(2)])
    assert [c.lane for c in lanes2.claim(10)] == ["a"]  # one at a time, not none or two
    sched2.close()
    sched.close()


def test_a_lapsed_fold_sweep_misses_no_job_when_promote_takes_the_head_between_slices(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepshift", redis=client)
    sched = _scheduler(client, floor, "sweepshift")
    _tick(sched)  # takes the lead and sets the epoch
    client.hset(q.keys.meta, "fold", "1")  # the fold lease ran out: no scheduler meanwhile
    ids = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(1500)])
    assert client.llen(q.keys.fold) == 0  # nobody logs them: only a sweep can fold them
    sched._start_sweep()
    sched._sweep()  # the first slice of the schedule set
    # between two slices the arbiter's promote takes 500 from the head (the test drives
    # the clock: their due time is now)
    head = client.zrange(q.keys.schedule, 0, 499)
    client.zadd(q.keys.schedule, {m: 0 for m in head})
    assert scripts.promote(client, q.keys, 500)[0] == 500
    while sched.sweep_offset is not None:
        sched._sweep()
    scheduled = {x.decode() for x in client.zrange(q.keys.schedule, 0, -1)}
    assert len(scheduled) == 1000 and scheduled <= set(ids)
    on_floor = {row.job_id for row in floor.rows("sweepshift", ids)}
    missed = scheduled - on_floor
    assert not missed, f"{len(missed)} scheduled jobs the sweep never folded"
    sched.close()


def test_a_lapsed_fold_sweep_misses_no_waiting_job_when_claims_pop_the_lane_between_slices(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweeppop", redis=client)
    sched = _scheduler(client, floor, "sweeppop")
    _tick(sched)
    client.hset(q.keys.meta, "fold", "1")  # lapsed
    ids = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(1500)])
    client.zadd(q.keys.schedule, {m: 0 for m in ids})  # all due: promoted onto the lane
    assert scripts.promote(client, q.keys, 1500)[0] == 1500
    sched._start_sweep()
    sched._sweep()  # the schedule set: empty
    assert sched.sweep_phase == "lanes"
    sched._sweep()  # the lane's first slice
    # between two slices a consumer claims 500 from the lane's head (and runs them)
    lanes = Lanes(client, q.keys, q.settings)
    claimed = lanes.claim(500)
    assert len(claimed) == 500
    while sched.sweep_offset is not None:
        sched._sweep()
    waiting = {x.decode() for x in client.lrange(q.keys.lane("default"), 0, -1)}
    assert len(waiting) == 1000
    on_floor = {row.job_id for row in floor.rows("sweeppop", ids)}
    missed = waiting - on_floor
    assert not missed, f"{len(missed)} waiting deferred jobs the sweep never folded"
    sched.close()


def _notice_lapse(sched: Scheduler) -> None:
    """A beat that finds the fold lease lapsed (or the logs over their bound) while its
    floor work waits (the floor backs off): the lead call renews the lease, so scripts
    log again from here on, and the sweep starts, to be driven a slice at a time."""
    sched.floor_retry_at = math.inf
    sched.tick(0.0)
    sched.floor_retry_at = 0.0
    assert sched.sweep_offset == 0 and sched.sweep_phase == "schedule"


def _leased_deferred(client: redis.Redis, q: echomq.Queue, lane: str = "default"
                     ) -> tuple[Lanes, Claimed]:
    """A job deferred while the fold lease had lapsed (so nobody logged it), promoted, and
    leased to a consumer: (the consumer's lanes, its claim)."""
    client.hset(q.keys.meta, "fold", "1")  # lapsed
    job_id = q.add("d", {}, delay=600, lane=lane)
    client.zadd(q.keys.schedule, {job_id: 0})  # the test drives the clock: due now
    assert scripts.promote(client, q.keys, 10)[0] == 1
    lanes = Lanes(client, q.keys, q.settings)
    [claimed] = lanes.claim(1)
    assert claimed.id == job_id
    return lanes, claimed


def _sweep_to(sched: Scheduler, phase: str) -> None:
    while sched.sweep_phase != phase:
        sched._sweep()


def _finish_sweep(sched: Scheduler) -> None:
    while sched.sweep_offset is not None:
        sched._sweep()
    _tick(sched)  # the next beat folds what the logs carry


def _assert_survives_valkey_loss(floor: Floor, server: LocalRedis, queue: str,
                                 job_id: str) -> None:
    """The job has a floor row, and comes back after Valkey loses its data."""
    assert [row.job_id for row in floor.rows(queue, [job_id])] == [job_id], (
        "a deferred job waiting on its lane has no floor row")
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    sched2 = _scheduler(client2, floor, queue)
    _tick(sched2)  # rehydrates from the floor
    assert echomq.Queue(queue, redis=client2).get(job_id) is not None, (
        "a deferred job was lost with Valkey's data")
    sched2.close()


def test_a_lapsed_fold_sweep_misses_no_job_handed_back_from_its_lease_to_a_swept_lane(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepback", redis=client)
    sched = _scheduler(client, floor, "sweepback")
    _tick(sched)
    lanes, claimed = _leased_deferred(client, q)
    _notice_lapse(sched)
    _sweep_to(sched, "leases")  # the schedule set and the lanes: the job is in neither
    # the consumer dies before the leases phase: the supervisor hands the job back
    assert lanes.release([(claimed.id, claimed.token)], "unstarted") == (1, 0)
    _finish_sweep(sched)
    assert q.get(claimed.id).state == "waiting"  # type: ignore[union-attr]
    _assert_survives_valkey_loss(floor, server, "sweepback", claimed.id)
    sched.close()


def test_a_lapsed_fold_sweep_misses_no_job_the_reap_hands_back_from_a_lapsed_lease(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepreap", redis=client)
    sched = _scheduler(client, floor, "sweepreap")
    _tick(sched)
    _, claimed = _leased_deferred(client, q)
    _notice_lapse(sched)
    _sweep_to(sched, "leases")
    client.zadd(q.keys.leases, {claimed.id: 0})  # the test drives the clock: the lease lapsed
    assert scripts.reap(client, q.keys)[:2] == (1, 0)  # the metronome's reap
    _finish_sweep(sched)
    assert q.get(claimed.id).state == "waiting"  # type: ignore[union-attr]
    _assert_survives_valkey_loss(floor, server, "sweepreap", claimed.id)
    sched.close()


@pytest.mark.parametrize("mode", ["stall", "suspect"])
def test_a_lapsed_fold_sweep_misses_no_job_released_from_a_dead_child(
        floor: Floor, server: LocalRedis, mode: str) -> None:
    # the supervisor's release of a dead child's running job: charged a stall when it ran
    # alone, marked to run alone when several ran
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepdead", redis=client)
    sched = _scheduler(client, floor, "sweepdead")
    _tick(sched)
    _, claimed = _leased_deferred(client, q)
    _notice_lapse(sched)
    _sweep_to(sched, "leases")
    assert scripts.release(client, q.keys, [(claimed.id, claimed.token)], mode) == (1, 0)
    _finish_sweep(sched)
    assert q.get(claimed.id).state == "waiting"  # type: ignore[union-attr]
    _assert_survives_valkey_loss(floor, server, "sweepdead", claimed.id)
    sched.close()


class _StoppedMidBatch(echomq.Consumer):
    """A consumer claiming two jobs at a time that is stopped as its second batch is
    leased, after ``hook`` ran: the drain hands that batch back unstarted."""

    def __init__(self, q: echomq.Queue, hook: Callable[[], None]) -> None:
        super().__init__(q, lambda job: None)
        self.hook = hook
        self.batches = 0

    def batch_size(self) -> int:
        return 2

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        super().on_batch(batch)
        self.batches += 1
        if self.batches == 2:
            self.hook()
            self.stop()


def test_a_lapsed_fold_sweep_misses_no_job_a_drain_hands_back_unstarted(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepdrain", redis=client)
    sched = _scheduler(client, floor, "sweepdrain")
    _tick(sched)
    client.hset(q.keys.meta, "fold", "1")  # lapsed
    ids = [q.add("d", {"i": i}, delay=600, job_id=f"j{i}") for i in range(3)]
    client.zadd(q.keys.schedule, {m: i for i, m in enumerate(ids)})  # due now, in order
    assert scripts.promote(client, q.keys, 10)[0] == 3
    _notice_lapse(sched)

    def sweep_past_the_lanes() -> None:  # j1 and j2 are leased now, the lanes empty
        _sweep_to(sched, "leases")

    consumer = _StoppedMidBatch(q, sweep_past_the_lanes)
    assert consumer.run(burst=True) == 1  # j0 ran; j1 and j2 went back unstarted
    _finish_sweep(sched)
    assert [q.get(j).state for j in ids[1:]] == ["waiting", "waiting"]  # type: ignore[union-attr]
    assert {row.job_id for row in floor.rows("sweepdrain", ids)} == set(ids[1:])
    sched.close()


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_a_job_handed_back_at_any_step_of_a_lapsed_fold_sweep_reaches_the_floor(
        floor: Floor, server: LocalRedis, steps: int) -> None:
    # the sweep's steps here: the schedule set (empty), lane "b" (the lane list is taken
    # as the lanes phase begins, when "a" is empty: its one job is leased), the leases,
    # then done; the job goes back to lane "a" after ``steps`` of them
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepstep", redis=client)
    sched = _scheduler(client, floor, "sweepstep")
    _tick(sched)
    lanes, claimed = _leased_deferred(client, q, lane="a")
    other = q.add("d", {}, delay=600, lane="b")
    client.zadd(q.keys.schedule, {other: 0})
    assert scripts.promote(client, q.keys, 10)[0] == 1
    _notice_lapse(sched)
    for _ in range(steps):
        sched._sweep()
    assert lanes.release([(claimed.id, claimed.token)], "unstarted") == (1, 0)
    _finish_sweep(sched)
    on_floor = {row.job_id for row in floor.rows("sweepstep", [claimed.id, other])}
    assert on_floor == {claimed.id, other}
    sched.close()


def test_a_job_handed_back_during_a_sweep_then_completed_leaves_no_open_row(
        floor: Floor, server: LocalRedis) -> None:
    # logged as it went back, claimed again and completed before the next beat, and
    # completed after a beat folded it: neither comes back after Valkey loses its data
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepdone", redis=client)
    sched = _scheduler(client, floor, "sweepdone")
    _tick(sched)
    lanes, first = _leased_deferred(client, q, lane="a")
    _, second = _leased_deferred(client, q, lane="b")
    _notice_lapse(sched)
    _sweep_to(sched, "leases")
    assert lanes.release([(first.id, first.token), (second.id, second.token)],
                         "unstarted") == (2, 0)
    [early] = lanes.claim(1)  # one of them is claimed again and completes at once
    assert lanes.settle([Outcome(early.id, early.token, "c")]) == [Settled.COMPLETED]
    ids = [first.id, second.id]
    [late] = set(ids) - {early.id}
    _finish_sweep(sched)
    assert [row.job_id for row in floor.rows("sweepdone", ids)] == [late]
    [c] = lanes.claim(1)
    assert c.id == late
    assert lanes.settle([Outcome(c.id, c.token, "c")]) == [Settled.COMPLETED]
    _tick(sched)  # closes its row
    assert floor.rows("sweepdone", ids) == []
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    sched2 = _scheduler(client2, floor, "sweepdone")
    _tick(sched2)
    assert client2.zcard(q.keys.schedule) == 0, "a completed job came back to run again"
    sched2.close()
    sched.close()


@pytest.mark.parametrize("cause", ["lapse", "dropped logs"])
def test_a_sweep_cut_short_by_a_new_leader_is_finished_by_it(
        floor: Floor, server: LocalRedis, cause: str) -> None:
    # the leader that started a sweep (it found the fold lease lapsed, or dropped logs over
    # their bound) swept one slice, then left (a restart, a crash): the next leader finds
    # the fold lease held, yet the sweep owed
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("sweepover", redis=client)
    first = _scheduler(client, floor, "sweepover", max_backlog=100)
    _tick(first)
    if cause == "lapse":
        client.hset(q.keys.meta, "fold", "1")
    ids = q.add_many([("d", {"i": i}, {"delay": 600}) for i in range(2500)])
    _notice_lapse(first)  # the beat that starts the sweep (the logs over 100: dropped)
    assert client.llen(q.keys.fold) == 0
    first._sweep()  # one slice of the schedule set
    cursor = first.sweep_offset
    assert cursor
    first.floor_retry_at = math.inf
    first.tick(0.0)  # its own sweep owed: a beat goes on with it, not from the start
    first.floor_retry_at = 0.0
    assert first.sweep_offset == cursor
    first.close()
    second = Scheduler("sweepover", client, floor, beat_ms=100, horizon_s=3600)
    for _ in range(3):
        _tick(second)
    missed = set(ids) - {row.job_id for row in floor.rows("sweepover", ids)}
    assert not missed, f"{len(missed)} deferred jobs the cut sweep never folded"
    assert client.hget(q.keys.meta, "sweep") is None  # owed no more
    second.close()
