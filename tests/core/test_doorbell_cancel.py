"""A doorbell read after its call was cancelled returns at once (nothing is outstanding)."""

from __future__ import annotations

import time

import redis

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
