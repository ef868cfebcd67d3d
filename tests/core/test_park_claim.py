"""The claim written behind a doorbell's pop (echomq.parkclaim), on a real server."""

from __future__ import annotations

import select

import redis

import echomq
from echomq import scripts
from echomq.config import QueueSettings
from echomq.keys import Keys
from echomq.lanes import Lanes
from echomq.parkclaim import ClaimingDoorbell


def _bell(url: str, queue: str, block_s: float = 0.2) -> tuple[ClaimingDoorbell, Lanes]:
    client = redis.Redis.from_url(url)
    lanes = Lanes(client, Keys(queue), QueueSettings())
    lanes.claimer = "c1"
    scripts.load_all(client, lanes.keys.prefix)  # as a consumer does at boot
    return ClaimingDoorbell(client, lanes.keys, block_s, "list",
                            lanes.claim_call(1, chain=True)), lanes


def _wait_readable(bell: ClaimingDoorbell, timeout: float = 5.0) -> None:
    ready, _, _ = select.select([bell.fileno()], [], [], timeout)
    assert ready, "no reply on the doorbell"


def test_a_ring_brings_the_job_leased_by_the_claim_behind_the_pop(redis_url: str,
                                                                  queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    bell, _ = _bell(redis_url, queue_name, block_s=5)
    bell.arm()
    jid = q.add("x", {"v": 1})
    _wait_readable(bell)
    # the server ran the claim at the ring, before this side read anything
    assert r.hget(Keys(queue_name).job(jid), "state") == b"active"
    assert bell.collect() is True
    claimed, unknown = bell.take()
    assert [c.id for c in claimed] == [jid] and not unknown
    assert claimed[0].attempts == 1
    assert bell.take() == ([], False)  # taken once
    bell.reset()
    q.close()


def test_a_block_that_runs_out_runs_the_claim_on_an_empty_queue_in_one_command(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    bell, _ = _bell(redis_url, queue_name, block_s=0.1)
    r.config_resetstat()
    bell.arm()
    _wait_readable(bell)
    assert bell.collect() is False
    assert bell.take() == ([], False)
    calls = {k: v["calls"] for k, v in r.info("commandstats").items()}
    for name in ("cmdstat_config|resetstat", "cmdstat_hello", "cmdstat_client|setinfo",
                 "cmdstat_client|id"):  # the connection's handshake
        calls.pop(name, None)
    assert calls == {"cmdstat_blpop": 1, "cmdstat_evalsha": 1, "cmdstat_exists": 1}, calls
    bell.reset()


def test_a_cancelled_pop_hands_its_claim_s_jobs_to_the_owner(redis_url: str,
                                                             queue_name: str) -> None:
    """Work waits on a lane with no ring left to pop (a ring another waiter took): the
    cancel ends the pop, the claim behind it runs and leases the job, and the owner gets it
    (it must run it or hand it back)."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    keys = Keys(queue_name)
    r = redis.Redis.from_url(redis_url)
    jid = q.add("x", {"v": 1})
    r.delete(keys.wake)
    bell, _ = _bell(redis_url, queue_name, block_s=5)
    bell.arm()
    bell.cancel()
    claimed, unknown = bell.take()
    assert [c.id for c in claimed] == [jid] and not unknown
    assert r.hget(keys.job(jid), "state") == b"active"
    bell.reset()
    q.close()


def test_a_claim_the_server_does_not_know_leases_nothing_and_leaves_the_connection_in_step(
        redis_url: str, queue_name: str) -> None:
    """After a restart that lost the scripts the claim behind the pop gets NOSCRIPT: it
    did not run, nothing is leased, and the connection reads the next pop's reply as its
    own."""
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    bell, _ = _bell(redis_url, queue_name, block_s=5)
    r.script_flush()
    bell.arm()
    jid = q.add("x", {})
    _wait_readable(bell)
    assert bell.collect() is True
    assert bell.take() == ([], False)
    assert r.hget(Keys(queue_name).job(jid), "state") == b"waiting"
    scripts.load_all(r, Keys(queue_name).prefix)
    q.add("x", {})
    bell.arm()
    _wait_readable(bell)
    assert bell.collect() is True
    claimed, unknown = bell.take()
    assert [c.id for c in claimed] == [jid] and not unknown
    bell.reset()
    q.close()


def test_a_connection_dropped_with_the_claim_unread_makes_it_unknown(redis_url: str,
                                                                    queue_name: str) -> None:
    bell, _ = _bell(redis_url, queue_name, block_s=5)
    bell.arm()
    bell.reset()  # what an overdue reply or a failed read does
    assert bell.take() == ([], True)
    bell.arm()  # a fresh connection, a fresh pop and claim
    assert bell.sent
    bell.cancel()
    assert bell.take() == ([], False)
    bell.reset()


def test_an_early_claim_on_an_empty_queue_leaves_the_claims_record_alone(
        redis_url: str, queue_name: str) -> None:
    """claim.lua's early return when no lane is on any ring: nothing leased, nothing
    recorded, and the next claim with work still leases it."""
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _, lanes = _bell(redis_url, queue_name)
    keys = Keys(queue_name)
    assert lanes.claim(1) == []
    assert not r.exists(keys.claims("c1"))
    jid = q.add("x", {})
    assert [c.id for c in lanes.claim(1)] == [jid]
    q.close()


def test_a_cancel_after_a_ring_the_claim_took_puts_no_ring_back(redis_url: str,
                                                                 queue_name: str) -> None:
    """The pop took a ring and the claim behind it leased the job before the owner
    cancelled: the job is the owner's, and no ring is put back to wake another waiter for
    work that is gone (a ring whose claim did not run is put back, as a plain doorbell's)."""
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    keys = Keys(queue_name)
    bell, _ = _bell(redis_url, queue_name, block_s=5)
    bell.arm()
    jid = q.add("x", {})
    _wait_readable(bell)  # both replies are on their way, unread
    bell.cancel()
    claimed, unknown = bell.take()
    assert [c.id for c in claimed] == [jid] and not unknown
    assert r.llen(keys.wake) == 0
    r.script_flush()  # the next claim does not run: its ring goes back
    bell.arm()
    q.add("x", {})
    _wait_readable(bell)
    bell.cancel()
    assert bell.take() == ([], False)
    assert r.llen(keys.wake) == 1
    bell.reset()
    q.close()
