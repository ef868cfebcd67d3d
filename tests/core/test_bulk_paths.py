"""The scripts' bulk paths: one lane claimed with one pop, leases and completions written
with one command per slice, runs of one lane admitted with one push. Each must hand out,
lease, settle and order exactly what the one-at-a-time path would."""

from __future__ import annotations

import redis

import echomq
from echomq.keys import Keys
from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled


def _lanes(q: echomq.Queue, **overrides: object) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings.with_overrides(**overrides))


def test_one_lane_claims_skip_ids_whose_hash_is_gone_and_still_fill_the_batch(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", i) for i in range(6)])
    r.delete(Keys(queue_name).job(ids[1]), Keys(queue_name).job(ids[3]))  # e.g. purged
    claimed = _lanes(q).claim(3)
    assert [c.id for c in claimed] == [ids[0], ids[2], ids[4]]  # in lane order
    assert r.lrange(Keys(queue_name).lane("default"), 0, -1) == [ids[5].encode()]
    assert q.counts()["waiting"] == 1 and q.counts()["active"] == 3


def test_a_lane_emptied_by_one_pop_leaves_the_ring(redis_url: str, queue_name: str,
                                                    r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(4)])
    assert len(_lanes(q).claim(10)) == 4
    assert r.llen(Keys(queue_name).ring) == 0 and q.stats()["lanes"] == 0
    assert _lanes(q).claim(10) == []


def test_a_claim_and_settle_past_the_slice_size_lease_and_finish_every_job(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=5000)
    ids = q.add_many([("x", i) for i in range(1200)])
    lanes = _lanes(q)
    claimed = lanes.claim(1200)
    keys = Keys(queue_name)
    assert [c.id for c in claimed] == ids
    assert r.zcard(keys.leases) == 1200
    codes = lanes.settle([Outcome(c.id, c.token, "c") for c in claimed])
    assert codes == [Settled.COMPLETED] * 1200
    assert r.zcard(keys.leases) == 0 and r.zcard(keys.completed) == 1200
    assert q.counts()["completed"] == 1200 and q.counts()["active"] == 0


def test_retention_past_the_bound_deletes_the_oldest_hashes_in_one_call(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=10)
    ids = q.add_many([("x", i) for i in range(40)])
    lanes = _lanes(q, keep_completed=10)
    claimed = lanes.claim(40)
    lanes.settle([Outcome(c.id, c.token, "c") for c in claimed])
    kept = [i.decode() for i in r.zrange(Keys(queue_name).completed, 0, -1)]
    assert len(kept) == 10 and set(kept) <= set(ids)
    assert sum(r.exists(Keys(queue_name).job(i)) for i in ids) == 10
    assert all(r.exists(Keys(queue_name).job(i)) for i in kept)


def test_a_bulk_add_over_several_slices_keeps_lane_order_and_joins_the_ring_once(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", i) for i in range(2500)])
    keys = Keys(queue_name)
    assert [i.decode() for i in r.lrange(keys.lane("default"), 0, -1)] == ids
    assert r.lrange(keys.ring, 0, -1) == [b"default"]
    assert q.counts()["waiting"] == 2500


def test_interleaved_lanes_in_one_add_keep_each_lanes_order_and_the_ring_order(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    lanes = ["a", "a", "b", "a", "c", "b", "b"]
    ids = q.add_many([("x", i, {"lane": lane}) for i, lane in enumerate(lanes)])
    keys = Keys(queue_name)
    for lane in "abc":
        expected = [j for j, lane_of in zip(ids, lanes, strict=True) if lane_of == lane]
        assert [i.decode() for i in r.lrange(keys.lane(lane), 0, -1)] == expected
    assert r.lrange(keys.ring, 0, -1) == [b"a", b"b", b"c"]  # in order of first job
    # a lane already waiting takes the next add's run at its tail, and is not rung twice
    more = q.add_many([("x", 9, {"lane": "b"})])
    assert r.lrange(keys.lane("b"), -1, -1) == [more[0].encode()]
    assert r.lrange(keys.ring, 0, -1) == [b"a", b"b", b"c"]


def test_a_claim_of_thousands_of_jobs_with_a_claims_record_hands_them_out(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # a claim appends its ids and tokens to the claimer's record: past Lua's unpack limit
    # (a few thousand values) in one call it would fail after it popped the ids, marked
    # them active and leased them, with no record naming them for the supervisor to hand
    # back (a claim_batch of 4,000, or a concurrency from ~2,700 with its prefetch)
    q = echomq.Queue(queue_name, redis_url=redis_url, claim_batch=4500)
    n = 4500
    ids = q.add_many([("x", i) for i in range(n)])
    lanes = Lanes(r, q.keys, q.settings)
    lanes.claimer = "probe"
    try:
        claimed = lanes.claim(n)
    except redis.exceptions.ResponseError as exc:
        stranded = r.zcard(q.keys.leases)
        raise AssertionError(f"the claim failed ({exc}), leaving {stranded} jobs leased to "
                             "nobody") from None
    assert [c.id for c in claimed] == ids
    assert r.zcard(q.keys.leases) == n
    record = r.lrange(q.keys.claims("probe"), 0, -1)
    assert len(record) == 2 * min(n, lanes.claims_kept)
    assert record[-2].decode() == ids[-1]
