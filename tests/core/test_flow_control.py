"""Flow control at the script level: lane limits (max_active, rate), their put-back on
settle, reap and release, and priorities."""

from __future__ import annotations

import asyncio

import pytest
import redis

import echomq
import echomq.aio
from echomq import scripts
from echomq.lanes import Lanes, Outcome, record_lane_limit
from echomq.scripts import Settled


def _lanes(q: echomq.Queue, **overrides: object) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings.with_overrides(**overrides))


def _ring(r: redis.Redis, key: str) -> list[str]:
    return [x.decode() for x in r.lrange(key, 0, -1)]


def _blocked_queue(q: echomq.Queue, r: redis.Redis, limit: int = 2) -> tuple[Lanes, list]:
    """Lane "a" (limit ``limit``) with 5 jobs, lane "b" with 3: one claim leaves "a" at its
    limit and off the ring."""
    q.set_lane_limit("a", max_active=limit)
    q.add_many([("x", i, {"lane": "a"}) for i in range(5)])
    q.add_many([("x", i, {"lane": "b"}) for i in range(3)])
    lanes = _lanes(q)
    claimed = lanes.claim(10)
    assert sorted(c.lane for c in claimed) == ["a"] * limit + ["b"] * 3
    assert _ring(r, q.keys.ring) == []  # b ran dry; a left the ring at its limit
    assert r.smembers(q.keys.blocked) == {b"0|a"}
    assert int(r.hget(q.keys.active, "a")) == 10**9 + limit  # the count, flagged blocked
    assert lanes.claim(10) == []  # a blocked lane costs claims nothing
    r.delete(q.keys.wake)
    return lanes, [c for c in claimed if c.lane == "a"]


def test_a_lane_at_its_limit_leaves_the_ring_and_settle_puts_it_back(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    lanes, held = _blocked_queue(q, r)
    assert lanes.settle([Outcome(held[0].id, held[0].token, "c")]) == [Settled.COMPLETED]
    assert _ring(r, q.keys.ring) == ["a"] and r.smembers(q.keys.blocked) == set()
    assert r.lrange(q.keys.wake, 0, -1) == [b"1"]  # rung: parked consumers claim it
    assert r.hget(q.keys.active, "a") == b"1"
    [again] = lanes.claim(10)  # one slot free: one job, and the lane is at its limit again
    assert again.lane == "a" and r.smembers(q.keys.blocked) == {b"0|a"}
    assert q.counts()["waiting"] == 2  # the blocked lane's jobs still count as waiting


@pytest.mark.parametrize("outcome", ["f", "d"])
def test_a_failed_or_dead_job_puts_its_lane_back(redis_url: str, queue_name: str,
                                                 r: redis.Redis, outcome: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    lanes, held = _blocked_queue(q, r)
    codes = lanes.settle([Outcome(held[0].id, held[0].token, outcome, "boom", 60_000)])
    assert codes == [Settled.RETRYING if outcome == "f" else Settled.DEAD]
    assert _ring(r, q.keys.ring) == ["a"] and b"1" in r.lrange(q.keys.wake, 0, -1)
    assert r.hget(q.keys.active, "a") == b"1"
    assert r.hget(q.keys.job(held[0].id), "held") in (None, b"0")


def test_reap_of_an_expired_lease_puts_its_lane_back(redis_url: str, queue_name: str,
                                                     r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    lanes, held = _blocked_queue(q, r)
    r.zadd(q.keys.leases, {held[0].id: 0})  # the lease ran out
    assert scripts.reap(r, q.keys)[:2] == (1, 0)
    assert _ring(r, q.keys.ring) == ["a"] and r.smembers(q.keys.blocked) == set()
    assert r.hget(q.keys.active, "a") == b"1" and r.lrange(q.keys.wake, 0, -1) == [b"1"]
    [again] = lanes.claim(10)
    assert again.id == held[0].id  # back at the head of its lane


@pytest.mark.parametrize("mode", ["stall", "requeue", "unstarted"])
def test_release_puts_the_lane_back(redis_url: str, queue_name: str, r: redis.Redis,
                                    mode: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_stalls=5)
    lanes, held = _blocked_queue(q, r)
    assert lanes.release([(c.id, c.token) for c in held], mode) == (2, 0)
    assert _ring(r, q.keys.ring) == ["a"] and r.hget(q.keys.active, "a") is None
    assert [c.id for c in lanes.claim(10)] == [c.id for c in held]  # in their order


def test_a_buried_job_puts_its_lane_back(redis_url: str, queue_name: str,
                                         r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_stalls=0)
    lanes, held = _blocked_queue(q, r)
    assert lanes.release([(held[0].id, held[0].token)], "stall") == (0, 1)
    assert _ring(r, q.keys.ring) == ["a"] and r.hget(q.keys.active, "a") == b"1"


@pytest.mark.parametrize("end", ["c", "f", "d", "reap", "stall", "requeue", "unstarted"])
def test_a_lane_with_nothing_counted_leaves_the_active_hash(redis_url: str, queue_name: str,
                                                            r: redis.Redis, end: str) -> None:
    """Lanes come and go (a lane per user, per tenant): once a lane's counted jobs have all
    ended, however they ended, it keeps no count, so the active hash holds only lanes that
    have jobs running instead of every lane that ever ran one."""
    q = echomq.Queue(queue_name, redis_url=redis_url, max_stalls=5)
    record_lane_limit(r, q.keys, 1)
    q.add_many([("x", i, {"lane": f"user-{i % 3}"}) for i in range(4)])  # user-0 gets two
    lanes = _lanes(q)
    held = lanes.claim(10)
    assert sorted(c.lane for c in held) == ["user-0", "user-1", "user-2"]
    assert r.hget(q.keys.active, "user-0") == str(10**9 + 1).encode()  # at its limit
    assert r.hlen(q.keys.active) == 3
    if end in ("c", "f", "d"):
        lanes.settle([Outcome(c.id, c.token, end, "x", 60_000) for c in held])
    elif end == "reap":
        r.zadd(q.keys.leases, {c.id: 0 for c in held})  # the leases ran out
        assert scripts.reap(r, q.keys)[0] == 3
    else:
        assert lanes.release([(c.id, c.token) for c in held], end)[0] == 3
    assert not r.exists(q.keys.active)  # neither a 0 nor a blocked flag left behind
    while batch := lanes.claim(10):  # the lanes still count what runs, from none
        assert int(r.hget(q.keys.active, batch[0].lane)) % 10**9 == 1
        lanes.settle([Outcome(c.id, c.token, "c") for c in batch])
    assert not r.exists(q.keys.active)


def test_max_active_1_is_strict_order_and_a_retry_frees_the_lane(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", max_active=1)
    ids = q.add_many([("x", i, {"lane": "a"}) for i in range(3)])
    lanes = _lanes(q)
    [first] = lanes.claim(10)
    assert first.id == ids[0] and lanes.claim(10) == []
    # job 1 fails with a backoff: the lane does not wait for its retry
    assert lanes.settle([Outcome(first.id, first.token, "f", "boom", 60_000)]) == [
        Settled.RETRYING]
    [second] = lanes.claim(10)
    assert second.id == ids[1]
    r.zadd(q.keys.schedule, {ids[0]: 0})  # the backoff passed: the retry joins the tail
    assert scripts.promote(r, q.keys, 100)[0] == 1
    assert lanes.settle([Outcome(second.id, second.token, "c")]) == [Settled.COMPLETED]
    assert [c.id for c in lanes.claim(10)] == [ids[2]]
    assert lanes.claim(10) == []


def test_the_queue_default_limits_every_lane(redis_url: str, queue_name: str,
                                             r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    record_lane_limit(r, q.keys, 1)
    q.set_lane_limit("wide", max_active=3)  # a lane's own limit overrides the default
    for lane in ("a", "b", "wide"):
        q.add_many([("x", i, {"lane": lane}) for i in range(5)])
    assert sorted(c.lane for c in _lanes(q).claim(20)) == ["a", "b", "wide", "wide", "wide"]
    assert q.lane_limits() == {"*": {"max_active": 1, "rate": None, "per_s": None},
                               "wide": {"max_active": 3, "rate": None, "per_s": None}}


def test_clearing_a_limit_puts_the_lane_back_at_once(redis_url: str, queue_name: str,
                                                     r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    lanes, _ = _blocked_queue(q, r)
    q.set_lane_limit("a")
    assert r.exists(q.keys.limits) == 0 and _ring(r, q.keys.ring) == ["a"]
    assert r.hget(q.keys.active, "a") == b"2"  # still counted, no longer flagged blocked
    assert r.lrange(q.keys.wake, 0, -1) == [b"1"]
    assert len(lanes.claim(10)) == 3


def test_a_rate_limited_lane_waits_for_its_window_on_the_server_clock(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", rate=3, per_s=60)
    q.add_many([("x", i, {"lane": "a"}) for i in range(10)])
    q.add_many([("x", i, {"lane": "b"}) for i in range(10)])
    lanes = _lanes(q)
    claimed = lanes.claim(20)
    assert sum(c.lane == "a" for c in claimed) == 3 and sum(c.lane == "b" for c in claimed) == 10
    opens = r.zscore(q.keys.lanewake, "a")
    started = int(q.get(claimed[0].id).started_ms)  # type: ignore[arg-type, union-attr]
    assert opens == started + 60_000
    # settling does not reopen a lane whose window is closed
    assert lanes.settle([Outcome(c.id, c.token, "c") for c in claimed])[0] == Settled.COMPLETED
    assert lanes.claim(20) == []
    promoted, next_due, now = scripts.promote(r, q.keys, 100)
    assert promoted == 0 and next_due == opens  # the metronome parks until the window opens
    r.zadd(q.keys.lanewake, {"a": int(now)})  # let the clock reach it (its whole ms)
    r.delete(q.keys.starts("a"))
    assert scripts.promote(r, q.keys, 100)[0] == 1
    assert r.lrange(q.keys.wake, 0, -1)[:1] == [b"1"]
    assert [c.lane for c in lanes.claim(20)] == ["a"] * 3


def test_a_new_rate_window_rings_a_parked_metronome(redis_url: str, queue_name: str,
                                                    r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", rate=1, per_s=30)
    q.add_many([("x", i, {"lane": "a"}) for i in range(3)])
    lanes = _lanes(q)
    assert len(lanes.claim(1)) == 1
    r.delete(q.keys.wake)
    assert lanes.claim(1) == []  # the window closed: the earliest wake, so it rings
    assert r.lrange(q.keys.wake, 0, -1) == [b"1"]


def test_priorities_go_first_and_lanes_stay_round_robin_within_one(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", f"low{i}", {"lane": "a"}) for i in range(50)])
    q.add_many([("x", f"nine-{lane}{i}", {"lane": lane, "priority": 9})
                for lane in ("a", "b") for i in range(2)])
    q.add("x", "five", lane="c", priority=5)
    assert q.get(q.add("x", "p", priority=3)).priority == 3  # type: ignore[union-attr]
    assert q.counts()["waiting"] == 56
    order = [c.payload_text for c in _lanes(q).claim(8)]
    assert order == ['"nine-a0"', '"nine-b0"', '"nine-a1"', '"nine-b1"', '"five"', '"p"',
                     '"low0"', '"low1"']
    assert q.stats()["lanes"] == 1


def test_priorities_with_lane_limits(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", max_active=1)
    q.add("x", "a-low", lane="a")
    q.add("x", "a-high", lane="a", priority=7)
    q.add("x", "b-low", lane="b")
    lanes = _lanes(q)
    first = lanes.claim(10)
    assert [c.payload_text for c in first] == ['"a-high"', '"b-low"']
    assert r.smembers(q.keys.blocked) == {b"0|a"}
    assert q.counts()["waiting"] == 1
    done = [Outcome(c.id, c.token, "c") for c in first]
    assert lanes.settle(done) == [Settled.COMPLETED] * 2
    assert [c.payload_text for c in lanes.claim(10)] == ['"a-low"']


def test_cancel_a_waiting_priority_job_of_a_blocked_lane(redis_url: str, queue_name: str,
                                                         r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", max_active=1)
    q.add("x", 1, lane="a", priority=4)
    waiting = q.add("x", 2, lane="a", priority=4)
    [c] = _lanes(q).claim(10)
    assert _lanes(q).claim(10) == [] and r.smembers(q.keys.blocked) == {b"4|a"}
    assert q.cancel(waiting)
    assert r.smembers(q.keys.blocked) == set()  # nothing left to put back
    assert _lanes(q).settle([Outcome(c.id, c.token, "c")]) == [Settled.COMPLETED]
    assert _ring(r, q.keys.ring_of(4)) == [] and q.counts()["waiting"] == 0


def test_retry_dead_and_promote_keep_the_priority(redis_url: str, queue_name: str,
                                                  r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", "low")
    later = q.add("x", "later", priority=2, delay=0.001)
    r.zadd(q.keys.schedule, {later: 0})
    assert scripts.promote(r, q.keys, 100)[0] == 1
    lanes = _lanes(q)
    [c] = lanes.claim(1)
    assert c.id == later
    assert lanes.settle([Outcome(c.id, c.token, "d", "gone")]) == [Settled.DEAD]
    assert q.retry_dead([later]) == 1
    assert [x.id for x in lanes.claim(1)] == [later]


def test_an_unused_queue_makes_no_flow_keys_and_runs_the_plain_claim(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i, {"lane": f"l{i % 3}"}) for i in range(9)])
    r.config_resetstat()
    claimed = _lanes(q).claim(9)
    calls = {k: v["calls"] for k, v in r.info("commandstats").items()}
    assert len(claimed) == 9
    assert "cmdstat_zrevrange" not in calls and "cmdstat_hget" not in calls
    # any lane on a ring (the ring and priorities at once), the pause flag, then limits
    # and priorities at once
    assert calls["cmdstat_exists"] == 3
    _lanes(q).settle([Outcome(c.id, c.token, "c") for c in claimed])
    flow = (q.keys.limits, q.keys.active, q.keys.blocked, q.keys.lanewake, q.keys.prios)
    assert r.exists(*flow) == 0


@pytest.mark.parametrize("bad", [-1, 10, 1.5, "9", True, None])
def test_an_invalid_priority_is_refused_and_nothing_admitted(
        redis_url: str, queue_name: str, r: redis.Redis, bad: object) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError, match="priority"):
        q.add("x", 1, priority=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="priority"):
        q.add_many([("x", 1), ("x", 2, {"priority": bad})])
    assert r.keys(q.keys.prefix + "*") == []


@pytest.mark.parametrize("kwargs", [{"max_active": 0}, {"rate": 0}, {"rate": 2, "per_s": 0},
                                    {"per_s": 1.0}, {"max_active": 1.5}, {"rate": True},
                                    # the active count's blocked flag is + 10^9: limits stay below
                                    {"max_active": 10**9}, {"rate": 10**130}])
def test_invalid_limits_are_refused(redis_url: str, queue_name: str, r: redis.Redis,
                                    kwargs: dict[str, object]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError):
        q.set_lane_limit("a", **kwargs)  # type: ignore[arg-type]
    q.set_lane_limit("a", max_active=10**9 - 1)  # the largest limit
    q.set_lane_limit("a")
    with pytest.raises(echomq.InvalidName):
        q.set_lane_limit("a b", max_active=1)
    assert r.exists(q.keys.limits) == 0


def test_aio_add_and_task_options_take_a_priority(redis_url: str, queue_name: str) -> None:
    async def admit() -> str:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            return await aq.add("x", 1, priority=6)
        finally:
            await aq.close()

    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = asyncio.run(admit())

    @echomq.task(queue=queue_name, redis_url=redis_url)
    def shout(text: str) -> str:
        return text

    sent = shout.options(priority=8).send("hi")
    assert q.get(job_id).priority == 6 and q.get(sent).priority == 8  # type: ignore[union-attr]
    assert [c.id for c in _lanes(q).claim(2)] == [sent, job_id]


def test_a_claim_past_1000_blocked_lanes_rings_so_the_next_one_goes_on(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("*", max_active=1)
    q.add_many([("x", i, {"lane": f"l{i % 1100}"}) for i in range(2200)])
    lanes = _lanes(q)
    assert len(lanes.claim(1100)) == 1100  # every lane at its limit, still on the ring
    q.add("x", "free", lane="z")  # behind 1,100 lanes at their limit
    r.delete(q.keys.wake)
    assert lanes.claim(1) == []  # stopped after 1,000 of them, and said so
    assert r.lrange(q.keys.wake, 0, -1) == [b"1"]
    assert [c.lane for c in lanes.claim(1)] == ["z"]
    assert r.scard(q.keys.blocked) == 1100 and r.llen(q.keys.ring) == 0


def test_the_waiting_listing_pages_through_priorities_and_blocked_lanes(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("held", max_active=1)
    held = q.add_many([("x", i, {"lane": "held"}) for i in range(4)])
    [running] = _lanes(q).claim(10)  # one of "held" runs
    assert _lanes(q).claim(10) == []  # and the lane leaves the ring at its limit
    ids = set(held) - {running.id}
    ids |= set(q.add_many([("x", i, {"lane": f"l{i % 5}"}) for i in range(13)]))
    ids |= set(q.add_many([("x", i, {"lane": f"l{i % 3}", "priority": 1 + i % 3})
                           for i in range(11)]))
    assert q.counts()["waiting"] == 27 == len(ids)
    for limit in (1, 4, 7, 100):
        seen: list[str] = []
        cursor = ""
        while True:
            page, cursor = q.jobs_page("waiting", limit=limit, cursor=cursor)
            seen += [j.id for j in page]
            if not cursor:
                break
        assert len(seen) == 27 and set(seen) == ids, limit
    first = q.jobs("waiting", limit=4)
    assert [j.priority for j in first] == [3, 3, 3, 2]  # in claim order: highest first


def test_a_consumer_records_its_queue_default_lane_limit(redis_url: str,
                                                         queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("*", rate=5, per_s=2.0)
    q.add_many([("x", i, {"lane": "a"}) for i in range(3)])
    echomq.Consumer(queue_name, lambda job: None, redis_url=redis_url,
                    lane_limit=2).run(burst=True)
    assert q.lane_limits()["*"] == {"max_active": 2, "rate": 5, "per_s": 2.0}  # rate kept
    assert q.counts()["completed"] == 3


def test_a_lane_blocked_at_two_priorities_goes_back_on_both_rings(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", max_active=1)
    q.add_many([("x", i, {"lane": "a", "priority": p}) for i, p in enumerate((5, 5, 0))])
    q.add("x", "other", lane="b", priority=5)
    lanes = _lanes(q)
    first = lanes.claim(1)  # a's first priority-5 job: a is at its limit
    rest = lanes.claim(10)  # meets a on ring 5 and on ring 0: off both; b runs
    assert [c.lane for c in first + rest] == ["a", "b"]
    assert r.smembers(q.keys.blocked) == {b"5|a", b"0|a"}
    assert lanes.settle([Outcome(first[0].id, first[0].token, "c")]) == [Settled.COMPLETED]
    assert _ring(r, q.keys.ring_of(5)) == ["a"] and _ring(r, q.keys.ring) == ["a"]
    assert r.smembers(q.keys.blocked) == set() and r.hget(q.keys.active, "a") is None
    [again] = lanes.claim(10)
    assert again.payload_text == "1"  # the priority-5 job first


def test_a_burst_consumer_goes_on_past_1000_blocked_lanes(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # a claim that stops after 1,000 lanes at their limit comes back empty and rings; a
    # consumer in burst mode (run until nothing is claimable) must not take that for dry
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("*", max_active=1)
    q.add_many([("x", i, {"lane": f"l{i % 1100}"}) for i in range(2200)])
    assert len(_lanes(q).claim(1100)) == 1100  # other consumers run one job of each lane
    free = q.add("x", "free", lane="z")  # behind 1,100 lanes at their limit
    ran: list[str] = []
    assert echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True) == 1
    assert ran == [free]
