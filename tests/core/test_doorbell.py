"""The two doorbells: every ringing script rings the kind the queue's meta names, and
nothing else; a marker scored by a due time tells the parked side when to promote."""

from __future__ import annotations

import re
import threading
import time

import pytest
import redis

import echomq
from echomq import scripts
from echomq.config import QueueSettings
from echomq.keys import Keys
from echomq.lanes import Lanes, Outcome
from echomq.wake import DoorbellMismatch, claim_doorbell

RING_PATTERN = re.compile(
    r"if redis\.call\('HGET', ARGV\[1\] \.\. 'meta', 'doorbell'\) == 'marker' then\n"
    # claimable work now ('0'), or a due time ('1', moved only earlier: LT)
    r"\s*redis\.call\('ZADD', ARGV\[1\] \.\. 'marker', (0, '0'|'LT', \w+, '1')\)\n"
    r"\s*else\n"
    # the list capped at 64 rings, trimmed only when a push went past that
    r"\s*if redis\.call\('LPUSH', (KEYS\[\d\]), '1'\) > 64 then "
    r"redis\.call\('LTRIM', \2, 0, 63\) end\n"
    r"\s*end\n")


def _rings(r: redis.Redis, keys: Keys) -> tuple[list[bytes], list[tuple[bytes, float]]]:
    return list(r.lrange(keys.wake, 0, -1)), list(r.zrange(keys.marker, 0, -1, withscores=True))


def _quiet(r: redis.Redis, keys: Keys) -> None:
    r.delete(keys.wake, keys.marker)


def test_every_ringing_script_rings_through_the_one_pattern() -> None:
    ringing = [s for s in scripts.ALL if "'LPUSH', KEYS[" in s.source]
    assert {s.name for s in ringing} >= {"admit", "schedule", "claim", "promote", "reap",
                                         "restore", "retry_dead", "settle"}
    for script in ringing:
        assert len(RING_PATTERN.findall(script.source)) == script.source.count("'LPUSH', KEYS["), (
            f"{script.name}.lua rings the wake list outside the doorbell pattern")


def test_scripts_ring_only_the_doorbell_the_meta_names(redis_url: str, queue_name: str,
                                                       r: redis.Redis, doorbell: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    keys = q.keys
    claim_doorbell(r, keys, doorbell)
    now_ring = ([b"1"], []) if doorbell == "list" else ([], [(b"0", 0.0)])

    def rang_now(action: object) -> None:
        assert _rings(r, keys) == now_ring, action
        _quiet(r, keys)

    _quiet(r, keys)
    q.add("x", 1, lane="a")
    rang_now("admit")
    later = q.add("x", 2, delay=60)
    due = r.zscore(keys.schedule, later)  # the head's due time, to the microsecond
    assert _rings(r, keys) == (([b"1"], []) if doorbell == "list" else ([], [(b"1", due)]))
    _quiet(r, keys)
    q.add("x", 3, lane="b")
    _quiet(r, keys)
    lanes = Lanes(r, keys, QueueSettings())
    [first] = lanes.claim(1, chain=True)  # lane b still waits: the next waiter is rung
    rang_now("claim with chain")
    assert lanes.release([(first.id, first.token)], "requeue") == (1, 0)
    rang_now("reap (release)")
    q.add("x", 4, delay=0.001)
    _quiet(r, keys)
    threading.Event().wait(0.01)
    assert scripts.promote(r, keys, 100)[0] == 1
    rang_now("promote")
    claimed = lanes.claim(10)
    failing = [Outcome(c.id, c.token, "f", "boom", 30_000) for c in claimed]
    codes = lanes.settle(failing)
    assert scripts.Settled.RETRYING in codes
    head_due = int(r.zrange(keys.schedule, 0, 0, withscores=True)[0][1])
    assert _rings(r, keys) == (([b"1"], []) if doorbell == "list"
                               else ([], [(b"1", float(head_due))]))


def test_the_wake_list_holds_64_rings_at_most_however_many_come(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """With nobody parked, 100 adds ring 100 times: the list keeps 64 rings (it is trimmed
    once a push takes it past 64, not at every ring), and a parked consumer still finds
    one."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    for i in range(63):
        q.add("x", i)
    assert r.llen(q.keys.wake) == 63
    for i in range(37):
        q.add("x", 63 + i)
        assert r.llen(q.keys.wake) == 64
    assert r.blpop([q.keys.wake], 1) == (q.keys.wake.encode(), b"1")


def test_retry_dead_rings_the_meta_doorbell(redis_url: str, queue_name: str, r: redis.Redis,
                                            doorbell: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_attempts=1)
    claim_doorbell(r, q.keys, doorbell)
    q.add("x", 1)
    echomq.Consumer(q, lambda job: 1 / 0, doorbell=doorbell).run(burst=True)
    _quiet(r, q.keys)
    assert q.retry_dead() == 1
    assert _rings(r, q.keys) == (([b"1"], []) if doorbell == "list" else ([], [(b"0", 0.0)]))


def test_a_consumer_of_the_other_kind_refuses_and_loses_nothing(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    claim_doorbell(r, q.keys, "list")
    q.add("x", 1)
    consumer = echomq.Consumer(q, lambda job: None, doorbell="marker")
    with pytest.raises(DoorbellMismatch, match=r"park on the 'list' doorbell.*--switch-doorbell"):
        consumer.run()
    assert consumer.processed == 0 and q.counts()["waiting"] == 1
    assert r.hget(q.keys.meta, "doorbell") == b"list"


def test_switching_records_the_new_kind_and_rings_it(redis_url: str, queue_name: str,
                                                     r: redis.Redis) -> None:
    keys = Keys(queue_name)
    claim_doorbell(r, keys, "list")
    _quiet(r, keys)
    claim_doorbell(r, keys, "marker", switch=True)
    assert r.hget(keys.meta, "doorbell") == b"marker"
    assert _rings(r, keys) == ([], [(b"0", 0.0)])  # work admitted before the switch is seen
    claim_doorbell(r, keys, "marker")  # the same kind again: accepted


def test_a_marker_consumer_promotes_a_delayed_job_once_at_its_due_time(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    started = threading.Event()
    go_on = threading.Event()
    seen: list[float] = []

    def handler(job: echomq.Job) -> None:
        seen.append(time.time())
        started.set()
        go_on.wait(5)  # hold the settle until the test has counted

    consumer = echomq.Consumer(q, handler, beat_ms=30_000, doorbell="marker")
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        _blocked(r)
        r.config_resetstat()
        due = time.time() + 0.3
        q.add("x", 1, delay=0.3)
        assert started.wait(3)
        calls = {k: v["calls"] for k, v in r.info("commandstats").items()}
        # the marker's score set the timer: one promote (one ZRANGEBYSCORE), at the due time,
        # not one on the ring and another when it fell due
        assert calls.get("cmdstat_zrangebyscore") == 1, calls
        # on time, never early; far below the 30 s beat (a loaded machine may delay it a
        # little: bench/delayed.py measures the lateness itself)
        assert -0.005 <= seen[0] - due < 1.0
    finally:
        go_on.set()
        consumer.stop()
        thread.join(5)


def test_a_stopping_marker_consumer_puts_a_future_marker_back(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    consumer = echomq.Consumer(q, lambda job: None, beat_ms=30_000, doorbell="marker")
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    _blocked(r)
    job_id = q.add("x", 1, delay=60)
    due = r.zscore(q.keys.schedule, job_id)  # to the microsecond
    _blocked(r)  # it took the marker, learned the due time and parked again
    assert r.zcard(q.keys.marker) == 0
    consumer.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert r.zrange(q.keys.marker, 0, -1, withscores=True) == [(b"1", due)]


def _blocked(r: redis.Redis, count: int = 1, timeout: float = 5.0) -> None:
    """Wait until ``count`` clients are blocked, and the last reply they got is consumed."""
    deadline = time.monotonic() + timeout
    while int(r.info("clients")["blocked_clients"]) < count:
        assert time.monotonic() < deadline, "consumer never parked"
        r.execute_command("CLIENT", "LIST")  # a round trip per check, bounded by the deadline
