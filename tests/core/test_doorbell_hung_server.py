"""A doorbell arming against a server that accepts connections but never answers gives
up within the grace, not the block: the supervisor's loop waits on that handshake."""

from __future__ import annotations

import signal
import time

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis

from echomq.keys import Keys
from echomq.wake import BLOCK_GRACE_S, Doorbell


def test_arming_against_a_hung_server_fails_within_the_grace_not_the_block(
        private_redis: LocalRedis, queue_name: str) -> None:
    r = redis.Redis.from_url(private_redis.url)
    bell = Doorbell(r, Keys(queue_name).wake, beat_s=60)  # a park of a minute
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)  # the kernel still accepts connections
    started = time.monotonic()
    try:
        with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
            bell.arm()
        waited = time.monotonic() - started
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    assert waited < BLOCK_GRACE_S + 5.0, f"the handshake waited {waited:.1f}s, as long as a park"
    bell.reset()
    bell.arm()  # the server answers again: the doorbell parks
    assert bell.armed
    bell.close()
