"""A consumer's claims record names every job it holds, with its buffer at its fullest:
the record is what the supervisor extends and hands back for jobs claimed ahead, so a
record that kept fewer pairs than a child may hold would leave some of them to wait out
their leases when the child dies before reading a claim's reply."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

import echomq
from echomq.concurrent import max_held
from echomq.config import QueueSettings
from echomq.keys import Keys
from echomq.lanes import Lanes

from .conftest import Supervisor
from .test_prefetch import _fill_running_and_buffer

Start = Callable[..., Supervisor]


def _record(r: redis.Redis, q: echomq.Queue) -> set[tuple[str, str]]:
    [key] = r.keys(q.keys.claims("*"))
    raw = [x.decode() for x in r.lrange(key, 0, -1)]
    return set(zip(raw[::2], raw[1::2], strict=True))


def test_the_claims_record_names_every_job_a_child_holds_with_a_full_buffer(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    # 20 running and a buffer of 10, claimed after 60 fast jobs that also went on the record
    sup, ids, _ = _fill_running_and_buffer(supervisor, redis_url, queue_name, r)
    held = {(j, r.hget(q.keys.job(j), "token").decode()) for j in ids}
    missing = held - _record(r, q)
    assert not missing, f"{len(missing)} of the {len(held)} jobs held are not on the record"
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 30))


@pytest.mark.parametrize("concurrency", [1, 2, 3, 7, 20, 101])
@pytest.mark.parametrize("claim_batch", [1, 10, 100])
def test_the_record_keeps_as_many_pairs_as_a_consumer_may_hold(
        redis_url: str, concurrency: int, claim_batch: int) -> None:
    settings = QueueSettings(concurrency=concurrency, claim_batch=claim_batch)
    lanes = Lanes(redis.Redis.from_url(redis_url), Keys("sizes"), settings)
    # whatever the buffer holds at the moment (0 up to the default prefetch), the jobs
    # running, buffered, finished and claimed beside a failed settle fit the record
    assert lanes.claims_kept >= max_held(concurrency, claim_batch)
