"""echomq.aio.Queue: the same scripts and keys as Queue, awaited from one event loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis

import echomq
from echomq.lanes import Lanes, Outcome

IGNORED_FIELDS = {"created_ms", "due_ms", "token", "finished_ms", "started_ms", "waited"}


class Sync:
    """Drives echomq.Queue."""

    def __init__(self, url: str, name: str) -> None:
        self.q = echomq.Queue(name, redis_url=url)
        self.keys = self.q.keys

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.q, method)(*args, **kwargs)

    def close(self) -> None:
        self.q.close()


class Async:
    """Drives echomq.aio.Queue on a loop of its own, one awaited call at a time."""

    def __init__(self, url: str, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.q = echomq.aio.Queue(name, redis_url=url)
        self.keys = self.q.keys

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.loop.run_until_complete(getattr(self.q, method)(*args, **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.q.close())
        self.loop.close()


def _hashes(r: redis.Redis, d: Sync | Async, ids: list[str]) -> list[dict[str, str]]:
    out = []
    for jid in ids:
        h = {k.decode(): v.decode() for k, v in r.hgetall(d.keys.job(jid)).items()}
        out.append({k: v for k, v in h.items() if k not in IGNORED_FIELDS})
    return out


def _finish(r: redis.Redis, d: Sync | Async, outcome: str, text: str) -> None:
    from echomq.config import QueueSettings

    lanes = Lanes(r, d.keys, QueueSettings())
    [c] = lanes.claim(1)
    lanes.settle([Outcome(c.id, c.token, outcome, text)])


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("value", call())
    except (echomq.JobFailed, echomq.JobNotFound, TimeoutError) as exc:
        return (type(exc).__name__, getattr(exc, "error", None))


def scenario_add(d: Sync | Async, r: redis.Redis) -> Any:
    ids = [d.call("add", "x", {"a": 1}, lane="l-1", job_id="j1", max_attempts=2, timeout=1.5,
                  dedup_s=5, backoff=0.5),
           d.call("add", "x", {"a": 1}, job_id="j1"),  # idempotent
           d.call("add", "y", [1, 2], job_id="j2", delay=30)]
    return ids, _hashes(r, d, ["j1", "j2"])


def scenario_add_many(d: Sync | Async, r: redis.Redis) -> Any:
    ids = d.call("add_many", [("a", 1, {"job_id": "m1"}), ("b", 2, {"job_id": "m2", "delay": 9}),
                              {"name": "c", "payload": 3, "job_id": "m3", "lane": "z"}])
    with pytest.raises(ValueError, match="unknown job option"):
        d.call("add_many", [("a", 1), ("b", 2, {"colour": "red"})])
    return ids, _hashes(r, d, ids)


def scenario_get(d: Sync | Async, r: redis.Redis) -> Any:
    d.call("add", "x", {"k": "v"}, job_id="g1", lane="l")
    job = d.call("get", "g1")
    fields = {k: v for k, v in vars(job).items() if k not in {"created_ms", "queue", "token"}}
    return fields, d.call("get", "missing")


def scenario_counts(d: Sync | Async, r: redis.Redis) -> Any:
    d.call("add_many", [("x", i) for i in range(3)])
    d.call("add", "x", 1, delay=60)
    _finish(r, d, "c", "")
    return d.call("counts")


def scenario_result(d: Sync | Async, r: redis.Redis) -> Any:
    done = d.call("add", "x", 1, job_id="r1")
    _finish(r, d, "c", json.dumps({"ok": True}))
    dead = d.call("add", "x", 2, job_id="r2", max_attempts=1)
    _finish(r, d, "f", "ValueError: boom")
    pending = d.call("add", "x", 3, job_id="r3")
    return [_outcome(lambda: d.call("result", done, timeout=1)),
            _outcome(lambda: d.call("result", dead, timeout=1)),
            _outcome(lambda: d.call("result", pending, timeout=0.1)),
            _outcome(lambda: d.call("result", "nope", timeout=0.1))]


def scenario_cancel(d: Sync | Async, r: redis.Redis) -> Any:
    d.call("add", "x", 1, job_id="c1")
    d.call("add", "x", 2, job_id="c2", delay=60)
    answers = [d.call("cancel", "c1"), d.call("cancel", "c2"), d.call("cancel", "c1"),
               d.call("cancel", "missing")]
    return answers, _hashes(r, d, ["c1", "c2"]), d.call("counts")


SCENARIOS = {"add": scenario_add, "add_many": scenario_add_many, "cancel": scenario_cancel,
             "get": scenario_get, "counts": scenario_counts, "result": scenario_result}


@pytest.mark.parametrize("method", sorted(SCENARIOS))
def test_aio_queue_matches_queue(method: str, redis_url: str, r: redis.Redis) -> None:
    seen = []
    for driver in (Sync, Async):
        d = driver(redis_url, f"t-{uuid.uuid4().hex[:12]}")
        try:
            seen.append(SCENARIOS[method](d, r))
        finally:
            d.close()
    assert seen[0] == seen[1]


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def test_aio_result_wakes_on_the_settle(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    async def main() -> Any:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        jid = await aq.add("x", 1)
        waiter = asyncio.create_task(aq.result(jid, timeout=10))
        base = int(r.info("clients")["blocked_clients"])
        settle = threading.Thread(target=_settle_when_blocked, args=(r, aq, base))
        settle.start()
        value = await waiter
        settle.join()
        await aq.close()
        return value

    assert _run(main()) == {"v": 1}


def _settle_when_blocked(r: redis.Redis, aq: echomq.aio.Queue, base: int) -> None:
    deadline = time.monotonic() + 10
    while int(r.info("clients")["blocked_clients"]) <= base:
        assert time.monotonic() < deadline
        threading.Event().wait(0.005)
    lanes = Lanes(r, aq.keys, aq.settings)
    [c] = lanes.claim(1)
    lanes.settle([Outcome(c.id, c.token, "c", json.dumps({"v": 1}))])


async def _unparked(r: redis.Redis, base: int) -> None:
    """Wait (5 s at most) until no more clients are blocked than ``base``."""
    deadline = time.monotonic() + 5
    while int(r.info("clients")["blocked_clients"]) > base:
        assert time.monotonic() < deadline, "the cancelled BLMOVE stayed parked"
        await asyncio.sleep(0.005)


def test_a_cancelled_aio_waiter_leaves_nothing_parked(redis_url: str, queue_name: str,
                                                      r: redis.Redis) -> None:
    async def main() -> None:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        jid = await aq.add("x", 1)
        base = int(r.info("clients")["blocked_clients"])
        waiter = asyncio.create_task(aq.result(jid))
        while int(r.info("clients")["blocked_clients"]) <= base:
            await asyncio.sleep(0.005)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await _unparked(r, base)
        await aq.close()

    _run(main())


class CancelAsWritten(redis.asyncio.Connection):
    """A waiter's connection that cancels ``victim`` the moment its BLMOVE is written:
    redis-py writes under ``asyncio.wait_for``, which on Python 3.11 returns the write's
    result and drops a cancel that lands as the write completes."""

    victim: asyncio.Task[Any] | None = None

    async def _send_packed_command(self, command: Any) -> None:
        await super()._send_packed_command(command)  # type: ignore[misc]
        if self.victim is not None and any(b"BLMOVE" in bytes(part) for part in command):
            self.victim.cancel()


def test_a_waiter_cancelled_as_its_park_is_written_ends_and_leaves_nothing_parked(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    async def main() -> None:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        jid = await aq.add("x", 1)
        base = int(r.info("clients")["blocked_clients"])
        assert aq._waiters is not None
        aq._waiters.connection_class = CancelAsWritten  # the hook: cancel as the park is sent
        waiter = asyncio.create_task(aq.result(jid))
        CancelAsWritten.victim = waiter
        try:
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(waiter), 5)
        finally:
            CancelAsWritten.victim = None
        await _unparked(r, base)
        await aq.close()

    _run(main())


def test_1000_concurrent_adds_from_one_loop_are_admitted_once(redis_url: str, queue_name: str,
                                                              r: redis.Redis) -> None:
    before = int(r.info("clients")["connected_clients"])

    async def main() -> list[str]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        ids = await asyncio.gather(*(aq.add("req", {"n": i}) for i in range(1000)))
        # and the same ids again: idempotent, nothing admitted twice
        await asyncio.gather(*(aq.add("req", {"n": i}, job_id=jid) for i, jid in enumerate(ids)))
        assert (await aq.counts())["waiting"] == 1000
        used = int(r.info("clients")["connected_clients"]) - before
        assert used <= echomq.aio.COMMAND_CONNECTIONS  # a bounded pool, not 1,000 sockets
        await aq.close()
        return list(ids)

    ids = _run(main())
    assert len(set(ids)) == 1000
    queued = [x.decode() for x in r.lrange(f"emq:{{{queue_name}}}:lane:default", 0, -1)]
    assert sorted(queued) == sorted(ids)
    assert int(r.info("clients")["connected_clients"]) <= before  # the pool was closed


def test_asend_admits_from_asyncio(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.hello", timeout=3.0,
                 lane=lambda who: f"u-{who}")
    async def hello(who: str) -> str:
        return f"hello {who}"

    echomq.configure(redis_url=redis_url)
    try:
        async def main() -> list[str]:
            return list(await asyncio.gather(hello.asend("ann"),
                                              hello.options(delay=5).asend("bob")))

        now, later = _run(main())
    finally:
        echomq.configure(redis_url=None)
    h = {k.decode(): v.decode() for k, v in r.hgetall(f"emq:{{{queue_name}}}:job:{now}").items()}
    assert (h["lane"], h["timeout_ms"], json.loads(h["payload"])) == (
        "u-ann", "3000", {"args": ["ann"], "kwargs": {}})
    assert r.hget(f"emq:{{{queue_name}}}:job:{later}", "state") == b"scheduled"


def test_concurrent_adds_share_round_trips_and_their_failure(redis_url: str, queue_name: str,
                                                             r: redis.Redis) -> None:
    async def main() -> tuple[int, list[Any]]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        before = int(r.info("commandstats")["cmdstat_evalsha"]["calls"])
        await asyncio.gather(*(aq.add("x", i) for i in range(200)))
        calls = int(r.info("commandstats")["cmdstat_evalsha"]["calls"]) - before
        await aq.close()
        dead = echomq.aio.Queue(queue_name, redis_url="redis://127.0.0.1:1/0")
        outcomes = await asyncio.gather(*(dead.add("x", i) for i in range(5)),
                                        return_exceptions=True)
        await dead.close()
        return calls, outcomes

    calls, outcomes = _run(main())
    assert calls < 20  # 200 adds in a few admit calls, not 200
    assert all(isinstance(o, echomq.ConnectionFailed) for o in outcomes), outcomes
    with pytest.raises(echomq.PayloadError):  # a bad job fails alone, before it is queued
        _run(echomq.aio.Queue(queue_name, redis_url=redis_url).add("x", {1, 2}))


def test_200_aio_waiters_cost_one_connection_each_and_no_commands(private_redis: Any) -> None:
    r = redis.Redis.from_url(private_redis.url)

    def calls() -> dict[str, int]:
        return {k: int(v["calls"]) for k, v in r.info("commandstats").items()}

    async def main() -> list[Any]:
        aq = echomq.aio.Queue("aio-results", redis_url=private_redis.url)
        ids = await aq.add_many([("x", i) for i in range(200)])
        baseline = int(r.info("clients")["connected_clients"])
        waiters = [asyncio.create_task(aq.result(jid, timeout=60)) for jid in ids]
        deadline = time.monotonic() + 10
        while int(r.info("clients")["blocked_clients"]) < 200:
            assert time.monotonic() < deadline, "the waiters never all parked"
            await asyncio.sleep(0.01)
        clients = r.info("clients")
        before = calls()
        await asyncio.sleep(1.0)  # the observation window: nothing may run in it
        after = calls()
        ran = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        assert set(ran) <= {"cmdstat_info"}, ran
        assert int(clients["blocked_clients"]) == 200
        assert int(clients["connected_clients"]) - baseline == 200, clients
        lanes = Lanes(r, aq.keys, aq.settings)
        claimed = lanes.claim(200)
        lanes.settle([Outcome(c.id, c.token, "c", json.dumps(c.id)) for c in claimed])
        values = await asyncio.gather(*waiters)
        assert values == ids
        await aq.close()
        return values

    assert len(_run(main())) == 200
    r.close()


def test_cancel_pause_resume_and_counts_match_the_sync_queue(redis_url: str,
                                                             queue_name: str) -> None:
    async def main() -> tuple[bool, bool, dict[str, int], bool, bool]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        later = await aq.add("later", {}, delay=60)
        await aq.add("now", {})
        cancelled, again = await aq.cancel(later), await aq.cancel(later)
        counts = await aq.counts()
        paused, resumed = await aq.pause(), await aq.resume()
        await aq.close()
        return cancelled, again, counts, paused, resumed

    cancelled, again, counts, paused, resumed = _run(main())
    assert (cancelled, again, paused, resumed) == (True, False, True, True)
    assert counts == echomq.Queue(queue_name, redis_url=redis_url).counts()
    assert counts["cancelled"] == 1 and counts["waiting"] == 1


def test_lane_limits_and_priorities_match_the_sync_queue(redis_url: str,
                                                         queue_name: str) -> None:
    async def main() -> list[str]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        await aq.set_lane_limit("a", max_active=2)
        await aq.set_lane_limit("*", rate=5, per_s=2.0)
        low = await aq.add("x", {}, lane="a")
        high = await aq.add("x", {}, lane="a", priority=9)
        with pytest.raises(ValueError):
            await aq.set_lane_limit("a", max_active=0)
        with pytest.raises(echomq.InvalidName):
            await aq.set_lane_limit("bad lane!", max_active=1)
        await aq.close()
        return [high, low]

    order = _run(main())
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.lane_limits() == {"a": {"max_active": 2, "rate": None, "per_s": None},
                               "*": {"max_active": None, "rate": 5, "per_s": 2.0}}
    lanes = Lanes(q.redis, q.keys, q.settings)
    assert [c.id for c in lanes.claim(2)] == order  # priority 9 first, both within the limit
