"""A payload no consumer can decode, under the supervisor: its job fails, nothing else does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import redis

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_payload_too_deep_to_decode_fails_its_job_and_its_batch_completes_once(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis,
        concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1",
                     "--concurrency", str(concurrency)).started(1)
    assert q.pause()
    ids = q.add_many([("x", {"n": i}) for i in range(24)])
    deep = ids[5]
    # written past admit, as a producer in another language could
    r.hset(q.keys.job(deep), "payload", "[" * 990 + "]" * 990)
    q.resume()
    others = [i for i in ids if i != deep]
    wait_until(lambda: q.counts()["completed"] == len(others)
               and r.hget(q.keys.job(deep), "state") == b"dead", 30,
               "the batch to complete and the deep job to go dead")
    error = (r.hget(q.keys.job(deep), "error") or b"").decode()
    assert "nested too deep to decode" in error, error
    assert int(r.hget(q.keys.job(deep), "stalls") or 0) == 0
    done = Counter(raw.decode() for raw in r.lrange(f"ledger:{queue_name}:done", 0, -1))
    assert done == Counter(others)  # every other job of the batch ran exactly once
    assert q.counts()["active"] == 0
    assert "exited with" not in sup.log and "killed by" not in sup.log, sup.log
    assert "never retrieved" not in sup.log, sup.log
