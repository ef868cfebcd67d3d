"""Queue.result: a per-job doorbell rung by settle; no polling, one blocking call per waiter."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import echomq
from echomq.config import QueueSettings
from echomq.lanes import Lanes, Outcome


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def _finish(q: echomq.Queue, outcome: str = "c", text: Any = None, count: int = 1) -> list[str]:
    """Claim ``count`` jobs and settle them all with one outcome; returns their ids."""
    lanes = _lanes(q)
    claimed = lanes.claim(count)
    assert len(claimed) == count
    body = json.dumps(text) if outcome == "c" and text is not None else (text or "")
    lanes.settle([Outcome(c.id, c.token, outcome, body) for c in claimed])
    return [c.id for c in claimed]


class Waiter(threading.Thread):
    """Calls q.result in a thread; records the value or the exception and when it returned."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.value: Any = None
        self.error: BaseException | None = None
        self.returned_at = 0.0
        self.start()

    def run(self) -> None:
        try:
            self.value = self.call()
        except BaseException as exc:
            self.error = exc
        self.returned_at = time.perf_counter()


def _blocked(r: redis.Redis, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while int(r.info("clients")["blocked_clients"]) < count:
        assert time.monotonic() < deadline, f"fewer than {count} clients ever blocked"
        threading.Event().wait(0.005)


def test_result_returns_at_once_for_a_finished_job(redis_url: str, queue_name: str,
                                                   r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    _finish(q, "c", {"answer": 42})
    t0 = time.perf_counter()
    assert q.result(jid, timeout=0) == {"answer": 42}
    assert time.perf_counter() - t0 < 1.0
    assert not r.exists(q.keys.done(jid)), "nobody waited: settle must not make a doorbell"


def test_result_wakes_a_parked_waiter_with_the_value(redis_url: str, queue_name: str,
                                                     r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    base = int(r.info("clients")["blocked_clients"])
    w = Waiter(lambda: q.result(jid, timeout=10))
    _blocked(r, base + 1)
    assert w.is_alive()
    _finish(q, "c", [1, "two"])
    w.join(5)
    assert w.error is None and w.value == [1, "two"]
    assert 0 < r.pttl(q.keys.done(jid)) <= 60_000  # the token is kept a minute, no longer


def test_result_wakes_within_5ms_of_the_settle(redis_url: str, queue_name: str,
                                               r: redis.Redis) -> None:
    """Median over many rounds of (waiter returned - settle returned); printed for the record."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    base = int(r.info("clients")["blocked_clients"])
    delays = []
    for i in range(40):
        jid = q.add("x", i)
        w = Waiter(lambda jid=jid: q.result(jid, timeout=10))
        _blocked(r, base + 1)
        _finish(q, "c", i)
        settled_at = time.perf_counter()
        w.join(5)
        assert w.value == i
        delays.append(max(0.0, w.returned_at - settled_at))
    median_ms = statistics.median(delays) * 1000
    print(f"result wake-up after settle: median {median_ms:.2f} ms, "
          f"max {max(delays) * 1000:.2f} ms over {len(delays)}")
    assert median_ms < 5.0, delays


def test_result_raises_job_failed_for_a_dead_job(redis_url: str, queue_name: str,
                                                 r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1, max_attempts=1)
    base = int(r.info("clients")["blocked_clients"])
    w = Waiter(lambda: q.result(jid, timeout=10))
    _blocked(r, base + 1)
    _finish(q, "f", "Traceback ...\nValueError: no such mailbox")
    w.join(5)
    assert isinstance(w.error, echomq.JobFailed)
    assert "no such mailbox" in w.error.error and "no such mailbox" in str(w.error)
    with pytest.raises(echomq.JobFailed):  # and at once, now that it is dead
        q.result(jid, timeout=0)


def test_result_times_out_within_50ms(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    late = []
    for timeout in (0.2, 0.3, 0.25, 0.2, 0.35):
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError):
            q.result(jid, timeout=timeout)
        elapsed = time.perf_counter() - t0
        assert elapsed >= timeout
        late.append(elapsed - timeout)
    assert statistics.median(late) < 0.05, late
    assert q.get(jid).state == "waiting"  # type: ignore[union-attr]


def test_result_of_an_unknown_job_raises_job_not_found(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.JobNotFound):
        q.result("never-admitted", timeout=1)


def test_a_result_dropped_by_retention_still_wakes_its_waiter(redis_url: str,
                                                              queue_name: str,
                                                              r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=0)
    jid = q.add("x", 1)
    base = int(r.info("clients")["blocked_clients"])
    w = Waiter(lambda: q.result(jid, timeout=10))
    _blocked(r, base + 1)
    _finish(q, "c", "gone")
    w.join(5)
    assert w.error is None and w.value is None
    assert q.get(jid) is None


def test_a_job_buried_by_stalls_wakes_its_waiter(redis_url: str, queue_name: str,
                                                 r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_stalls=0)
    jid = q.add("x", 1)
    base = int(r.info("clients")["blocked_clients"])
    w = Waiter(lambda: q.result(jid, timeout=10))
    _blocked(r, base + 1)
    lanes = _lanes(q)
    [c] = lanes.claim(1)
    assert lanes.release([(c.id, c.token)], "stall") == (0, 1)
    w.join(5)
    assert isinstance(w.error, echomq.JobFailed) and "stalled" in w.error.error


def test_a_retried_dead_job_does_not_wake_on_its_old_token(redis_url: str, queue_name: str,
                                                           r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1, max_attempts=1)
    base = int(r.info("clients")["blocked_clients"])
    w = Waiter(lambda: q.result(jid, timeout=10))
    _blocked(r, base + 1)
    _finish(q, "f", "boom")
    w.join(5)
    assert isinstance(w.error, echomq.JobFailed)
    assert q.retry_dead([jid]) == 1
    with pytest.raises(TimeoutError):
        q.result(jid, timeout=0.2)
    w2 = Waiter(lambda: q.result(jid, timeout=10))
    _blocked(r, base + 1)
    _finish(q, "c", "second time")
    w2.join(5)
    assert w2.value == "second time"


def test_every_waiter_on_one_job_wakes(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    base = int(r.info("clients")["blocked_clients"])
    waiters = [Waiter(lambda: q.result(jid, timeout=10)) for _ in range(30)]
    _blocked(r, base + 30)
    _finish(q, "c", "shared")
    for w in waiters:
        w.join(5)
    assert [w.value for w in waiters] == ["shared"] * 30


def _commandstats(r: redis.Redis) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in r.info("commandstats").items()}


def test_200_waiters_cost_one_blocking_connection_each_and_no_commands(
        private_redis: Any) -> None:
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("results", redis_url=private_redis.url,
                     settings=QueueSettings(keep_completed=None))
    ids = q.add_many([("x", i) for i in range(200)])
    baseline = int(r.info("clients")["connected_clients"])
    waiters = [Waiter(lambda jid=jid: q.result(jid, timeout=60)) for jid in ids]
    _blocked(r, 200)
    clients = r.info("clients")
    before = _commandstats(r)
    threading.Event().wait(1.0)  # the observation window: nothing may run in it
    after = _commandstats(r)
    ran = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert set(ran) <= {"cmdstat_info"}, ran
    assert int(clients["blocked_clients"]) == 200
    assert int(clients["connected_clients"]) - baseline == 200, clients  # one each, no more
    settled = _finish(q, "c", "done", count=200)
    assert sorted(settled) == sorted(ids)
    for w in waiters:
        w.join(10)
    assert [w.error for w in waiters] == [None] * 200
    assert [w.value for w in waiters] == ["done"] * 200
    r.close()
    q.close()


def test_a_zero_timeout_only_peeks(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    with pytest.raises(TimeoutError):
        q.result(jid, timeout=0)
    assert r.hget(q.keys.job(jid), "waited") is None  # nobody parks, so nothing to ring
    _finish(q, "c", 7)
    assert not r.exists(q.keys.done(jid))
    assert q.result(jid, timeout=0) == 7


def test_result_reloads_its_script_after_a_flush(redis_url: str, queue_name: str,
                                                  r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    _finish(q, "c", "v")
    r.script_flush()
    assert q.result(jid, timeout=1) == "v"


def test_a_cancelled_job_answers_at_once(redis_url: str, queue_name: str,
                                         r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    r.hset(q.keys.job(jid), "state", "cancelled")  # as a cancel leaves it
    with pytest.raises(echomq.JobFailed, match="cancelled"):
        q.result(jid, timeout=5)


def test_a_waiter_whose_doorbell_expired_still_reads_the_outcome_at_its_deadline(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """A waiter paused between marking the job and parking finds no token left."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    with pytest.raises(TimeoutError):  # marks the job (and times out almost at once)
        q.result(jid, timeout=0.01)
    _finish(q, "c", "late")
    r.delete(q.keys.done(jid))  # as if the minute had passed
    r.hset(q.keys.job(jid), "state", "active")  # the park cannot see it finished ...
    base = int(r.info("clients")["blocked_clients"])
    w = Waiter(lambda: q.result(jid, timeout=0.3))
    _blocked(r, base + 1)
    r.hset(q.keys.job(jid), "state", "completed")  # ... finished without a token
    w.join(5)
    assert w.error is None and w.value == "late"
    assert r.pttl(q.keys.done(jid)) == -2
