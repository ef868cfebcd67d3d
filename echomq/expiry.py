"""Expiry of jobs not started in time: ``Queue.add(..., expires=)``.

A job with an expiry carries ``expires_ms`` and sits in the queue's expiring zset. It
never starts after that time: claim.lua cancels one it meets past it (error "expired"),
and the metronome's pass (expire.lua) cancels those still waiting or scheduled, so they
leave their lanes and the schedule even where nobody claims.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime
from typing import Any

import redis
import redis.exceptions

from echomq.admit import MAX_DUE_MS, Call
from echomq.backoff import MAX_DELAY_S
from echomq.errors import InvalidSchedule
from echomq.keys import Keys
from echomq.scripts import EXPIRE, EXPIRE_MARK

EXPIRED_TEXT = "expired"
PASS_LIMIT = 1000  # ids one pass looks at; more wait for the next


def expiring_key(k: Keys) -> str:
    """The zset of job ids with an expiry, scored by it (ms)."""
    return k.prefix + "expiring"


def expires_arg(expires: Any) -> int:
    """The expiry as expire_mark.lua takes it: -ms from now, or absolute ms for a datetime.
    InvalidSchedule for anything but a finite number of seconds > 0 (at most 100 years)
    or a timezone-aware datetime."""
    if isinstance(expires, datetime):
        if expires.tzinfo is None or expires.utcoffset() is None:
            raise InvalidSchedule("expires must be timezone-aware, not naive")
        at = int(expires.timestamp() * 1000)
        if not 0 < at <= MAX_DUE_MS:
            raise InvalidSchedule(f"expires {expires.isoformat()} is out of range")
        return at
    if isinstance(expires, bool) or not isinstance(expires, (int, float)) or not (
            math.isfinite(expires) and 0 < expires <= MAX_DELAY_S):
        raise InvalidSchedule(f"expires must be a finite number of seconds > 0 (at most 100 "
                              f"years) or an aware datetime, got {expires!r}")
    return -max(1, int(expires * 1000))


def mark_call(k: Keys, job_id: str, arg: int, payload: str | None = None) -> Call:
    """The expire_mark.lua call that follows a job's admit in one transaction;
    ``payload``: the encoded payload the add sent (another job under the same id, which
    the admit left alone, is then not marked)."""
    digest = "" if payload is None else hashlib.sha1(payload.encode()).hexdigest()
    return EXPIRE_MARK, [expiring_key(k)], [k.prefix, job_id, arg, digest]


def expire_pass(client: redis.Redis, k: Keys, limit: int = PASS_LIMIT) -> tuple[int, int | None]:
    """Cancel the waiting and scheduled jobs whose expiry passed: (how many, the next
    expiry in server ms or None)."""
    n, head = EXPIRE(client, [expiring_key(k), k.schedule, k.ring, k.cancelled, k.stats,
                              k.blocked, k.meta, k.closed, k.spilled, k.events], [k.prefix, limit])
    return int(n), (int(float(head)) if head else None)
