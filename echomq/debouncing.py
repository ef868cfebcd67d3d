"""Debounce that keeps every payload: ``Queue.add(name, payload, debounce=key,
debounce_s=..., debounce_max_s=...)``.

Adds with one key gather into one scheduled job (debounce.lua, atomic): it runs
``debounce_s`` after the last add, never later than ``debounce_max_s`` after the first,
and its handler reads ``job.payloads`` (every payload in order; ``job.payload`` is the
last). An add after the job started opens a new one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import redis
import redis.exceptions

from echomq.backoff import MAX_DELAY_S
from echomq.connection import translated
from echomq.errors import InvalidSchedule
from echomq.keys import Keys
from echomq.scripts import DEBOUNCE

if TYPE_CHECKING:
    from echomq.admit import AdmitPlanner, Call
    from echomq.queue import Queue

MAX_KEY_CHARS = 128


class DebounceClash(ValueError):
    """A job_id given with a debounce key names another job."""


def seconds(value: Any, what: str, *, optional: bool = False) -> float | None:
    """A debounce duration: a finite number of seconds > 0, at most 100 years."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 < value <= MAX_DELAY_S):
        raise InvalidSchedule(f"{what} must be a finite number of seconds > 0 (at most 100 "
                              f"years), got {value!r}")
    return float(value)


def check(debounce: Any, debounce_s: Any, debounce_max_s: Any) -> tuple[str, int, int]:
    """Validate the debounce options: (key, debounce_ms, max_ms)."""
    if not isinstance(debounce, str) or not debounce or len(debounce) > MAX_KEY_CHARS \
            or any(c.isspace() or not c.isprintable() for c in debounce):
        raise ValueError(f"debounce must be a non-empty printable key of at most "
                         f"{MAX_KEY_CHARS} chars without spaces, got {debounce!r}")
    wait = seconds(debounce_s, "debounce_s")
    most = seconds(debounce_max_s, "debounce_max_s", optional=True)
    assert wait is not None
    if most is None:
        most = wait
    if most < wait:
        raise InvalidSchedule(f"debounce_max_s ({most:g}) must be at least debounce_s "
                              f"({wait:g})")
    return debounce, max(1, int(wait * 1000)), max(1, int(most * 1000))


def call(planner: AdmitPlanner, name: str, payload: Any, debounce: Any, debounce_s: Any,
         debounce_max_s: Any, *, lane: str | None, delay: Any, run_at: Any,
         job_id: str | None, max_attempts: int | None, backoff: Any, timeout: float | None,
         dedup_s: float | None, priority: int, expires: Any) -> Call:
    """Validate an add with a debounce key: the debounce.lua call (nothing sent)."""
    key, wait_ms, max_ms = check(debounce, debounce_s, debounce_max_s)
    if delay is not None or run_at is not None:
        raise InvalidSchedule("debounce sets the job's due time: give no delay or run_at")
    if expires is not None:
        raise InvalidSchedule("expires cannot be combined with debounce")
    new_id, a, _ = planner.spec(name, payload, lane, None, None, job_id, max_attempts,
                                backoff, timeout, dedup_s, priority)
    # a: id, name, payload, lane, max_attempts, max_stalls, backoff, timeout_ms, dedup_ms,
    # trace, priority (admit.lua's order)
    args = [planner.keys.prefix, key, new_id, "1" if job_id is not None else "0", *a[1:],
            wait_ms, max_ms]
    return DEBOUNCE, debounce_keys(planner.keys), args


def job_id_of(reply: Any) -> str:
    """The job id in debounce.lua's reply."""
    got = reply[0]
    return got.decode() if isinstance(got, bytes) else str(got)


@contextmanager
def clashes() -> Iterator[None]:
    """debounce.lua's "job id clashes" error reply as DebounceClash."""
    try:
        yield
    except redis.exceptions.ResponseError as exc:
        if "job id clashes" in str(exc):
            raise DebounceClash(str(exc).removeprefix("ERR ")) from None
        raise


def add(q: Queue, name: str, payload: Any, debounce: Any, debounce_s: Any,
        debounce_max_s: Any, **options: Any) -> str:
    """Queue.add with a debounce key: the id of the job the add gathered into."""
    script, keys, args = call(q.planner, name, payload, debounce, debounce_s, debounce_max_s,
                              **options)
    with translated(q.where):
        q.register()
        with clashes():
            return job_id_of(script(q.redis, keys, args))


def debounce_keys(k: Keys) -> list[str]:
    """KEYS of debounce.lua."""
    return [k.schedule, k.wake, k.meta, k.fold, k.events]


def read_batch(client: redis.Redis, k: Keys, job_id: str) -> list[Any] | None:
    """A debounced job's payloads (None for a job that has none)."""
    text = client.hget(k.job(job_id), "payloads")
    if not text:
        return None
    value = json.loads(text)
    return value if isinstance(value, list) else None

