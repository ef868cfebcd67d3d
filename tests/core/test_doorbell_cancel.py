"""Cancelling a doorbell's pop: a read after it returns at once (nothing is outstanding),
and a cancel that reaches the server before the pop still ends it."""

from __future__ import annotations

import time

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis

from echomq.keys import Keys
from echomq.wake import Doorbell


def test_collect_after_cancel_returns_at_once(r: redis.Redis, queue_name: str) -> None:
    bell = Doorbell(r, Keys(queue_name).wake, beat_s=30)
    bell.arm()
    bell.cancel()  # a supervisor draining: the socket may still be in this turn's ready list
    started = time.monotonic()
    assert bell.collect() is False
    assert time.monotonic() - started < 5.0  # not the socket timeout (beat + grace)
    bell.close()


def test_cancel_that_overtakes_its_pop_ends_it_once_the_server_runs_it(
        private_redis: LocalRedis, queue_name: str) -> None:
    # the pop and CLIENT UNBLOCK go out on different connections: the server can run the
    # UNBLOCK first (here: writes paused, so the pop waits while the UNBLOCK answers 0).
    # The pop then blocked for its whole timeout and close() waited for it: a stop()
    # hung for a beat
    r = redis.Redis.from_url(private_redis.url)
    version = tuple(int(p) for p in str(r.info("server")["redis_version"]).split(".")[:2])
    if version < (7, 2):
        pytest.skip("redis-server before 7.2 aborts on CLIENT UNBLOCK of a client that "
                    "CLIENT PAUSE holds (the way this test holds the pop back)")
    keys = Keys(queue_name)
    bell = Doorbell(r, keys.wake, beat_s=30)
    bell.arm()
    bell.cancel()  # connected, its client id known
    r.execute_command("CLIENT", "PAUSE", 500, "WRITE")
    bell.arm()
    started = time.monotonic()
    bell.cancel()
    # the pause ends after 0.5 s and the repeated UNBLOCK ends the pop then; a cancel
    # that gave up on it waited for the pop's block or, at best, the connection's 5 s
    # grace before it was dropped
    assert time.monotonic() - started < 3.0, "cancel waited for the pop's block or the grace"
    assert int(r.info("clients")["blocked_clients"]) == 0
    r.lpush(keys.wake, "1")  # a ring now is not taken by the cancelled pop
    assert r.llen(keys.wake) == 1
    bell.close()
