"""The "durable" dial: every admitted job, immediate ones too, is on the floor before
add()/add_many() returns; finished jobs' rows close within a beat; after Valkey loses its
data every open row comes back, waiting jobs on their lanes in admit order."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from typing import Any

import pytest
import redis
from beats import tick as _tick
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
import echomq.aio
from echomq.errors import ConfigError
from echomq.expiry import expire_pass, expiring_key
from echomq.floor import Floor
from echomq.floor.writethrough import write_current
from echomq.lanes import Lanes, Outcome


def _scheduler(client: redis.Redis, floor: Floor, queue: str) -> Scheduler:
    s = Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600)
    client.hset(f"emq:{{{queue}}}:meta", "fold", "1")  # as a leading scheduler's lease
    return s


def _order(q: echomq.Queue, lane: str = "default") -> list[str]:
    return [x.decode() for x in q.redis.lrange(q.keys.lane(lane), 0, -1)]


def test_every_job_is_on_the_floor_before_add_returns(floor: Floor, server: LocalRedis,
                                                      floor_url: str) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("dur", redis=client, floor=floor_url, durability="durable")
    assert isinstance(q.floor, Floor)  # floor= takes a URL
    one = q.add("now", {"i": 0})
    assert [r.job_id for r in floor.open_rows("dur", None, 10)] == [one]
    many = q.add_many([("now", {"i": i}) for i in range(1, 300)]
                      + [("later", {"i": 300}, {"delay": 600})])
    rows = {r.job_id: r for r in floor.open_rows("dur", None, 1000)}
    assert set(rows) == {one, *many}
    assert rows[many[0]].fields["state"] == "waiting"
    assert rows[many[-1]].fields["state"] == "scheduled"
    q.floor.dispose()


def test_a_producer_of_a_durable_queue_without_a_floor_admits_nothing(
        server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("nofloor", redis=client, durability="durable")
    with pytest.raises(ConfigError, match="floor=FLOOR_URL"):
        q.add("now", {})
    assert q.counts()["waiting"] == 0


def test_the_dial_recorded_in_the_meta_makes_a_plain_producer_durable(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("meta", redis=client, floor=floor)
    client.hset(q.keys.meta, "durability", "durable")  # as the supervisor records it
    job_id = q.add("now", {})
    assert [r.job_id for r in floor.open_rows("meta", None, 10)] == [job_id]


def test_finished_jobs_close_their_rows_within_a_beat(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("close", redis=client, floor=floor, durability="durable")
    sched = _scheduler(client, floor, "close")
    _tick(sched)
    ids = q.add_many([("ok", {"i": i}) for i in range(20)]
                     + [("bad", {}, {"max_attempts": 1}), ("gone", {})])
    assert floor.count("close") == 22
    assert q.cancel(ids[-1])

    def handler(job: echomq.Job) -> None:
        if job.name == "bad":
            raise ValueError("no")

    echomq.Consumer(q, handler).run(burst=True)
    assert q.counts()["completed"] == 20 and q.counts()["dead"] == 1
    _tick(sched)  # one beat closes every finished job's row, in one batch
    assert floor.count("close") == 0


def test_a_flushall_loses_no_waiting_job_and_keeps_lane_order(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("wipe", redis=client, floor=floor, durability="durable")
    sched = _scheduler(client, floor, "wipe")
    _tick(sched)
    a = q.add_many([("j", {"i": i}, {"lane": "a"}) for i in range(1500)])
    b = [q.add("j", {"i": i}, lane="b") for i in range(50)]
    high = q.add("j", {"urgent": True}, priority=5)
    later = q.add("j", {}, delay=600)
    # some run to the end first: their rows close, they do not come back
    lanes = Lanes(client, q.keys, q.settings)
    claimed = lanes.claim(10)
    lanes.settle([Outcome(c.id, c.token, "c", "null", 0) for c in claimed])
    done = {c.id for c in claimed}
    assert len(done) == 10 and high in done
    high2 = q.add("j", {"urgent": 2}, priority=5)
    _tick(sched)
    client.flushall()
    sched.tick(0.0)  # notices the epoch gone
    _tick(sched)
    counts = q.counts()
    assert counts["waiting"] == 1542 and counts["scheduled"] == 1
    assert _order(q, "a") == [x for x in a if x not in done]
    assert _order(q, "b") == [x for x in b if x not in done]
    assert client.lrange(q.keys.lane("default", 5), 0, -1) == [high2.encode()]
    assert q.get(later) is not None and q.get(later).state == "scheduled"
    ran = Counter[str]()
    echomq.Consumer(q, lambda job: ran.update([job.id]), pump_batch=500).run(burst=True)
    assert set(ran) == (set(a) | set(b) | {high2}) - done
    assert set(ran.values()) == {1}
    _tick(sched)
    assert floor.count("wipe") == 1  # only the deferred one is open


def test_a_job_brought_back_keeps_its_expiry_for_the_pass(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("expiry", redis=client, floor=floor, durability="durable")
    sched = _scheduler(client, floor, "expiry")
    _tick(sched)
    limited = q.add("j", {}, lane="slow", expires=600)
    later = q.add("j", {}, delay=300, expires=600)
    plain = q.add("j", {}, lane="slow")
    expiring = {x: int(client.hget(q.keys.job(x), "expires_ms") or 0) for x in (limited, later)}
    _tick(sched)
    client.flushall()
    sched.tick(0.0)  # notices the epoch gone
    _tick(sched)
    assert {x.decode(): int(s) for x, s in client.zrange(
        expiring_key(q.keys), 0, -1, withscores=True)} == expiring
    # past its expiry while it waits (behind a lane at its limit, say): the pass ends it
    for x in (limited, later):
        client.hset(q.keys.job(x), "expires_ms", 1)
        client.zadd(expiring_key(q.keys), {x: 1})
    assert expire_pass(client, q.keys)[0] == 2
    for x in (limited, later):
        job = q.get(x)
        assert job is not None and job.state == "cancelled" and job.error == "expired"
    assert q.get(plain).state == "waiting"  # type: ignore[union-attr]


def test_aio_add_is_on_the_floor_before_it_returns(floor: Floor, server: LocalRedis,
                                                   floor_url: str) -> None:
    async def main() -> list[str]:
        aq = echomq.aio.Queue("adur", redis_url=server.url, floor=floor_url,
                              durability="durable")
        ids = list(await asyncio.gather(*(aq.add("now", {"i": i}) for i in range(30))))
        ids += await aq.add_many([("now", {"i": 30})])
        await aq.close()
        return ids

    ids = asyncio.run(main())
    assert {r.job_id for r in floor.open_rows("adur", None, 100)} == set(ids)


@pytest.mark.parametrize("producer", ["sync", "asyncio"])
@pytest.mark.parametrize("dial", ["durable", "sync"])
def test_an_expiring_or_debounced_add_is_on_the_floor_before_it_returns(
        floor: Floor, server: LocalRedis, floor_url: str, dial: str, producer: str) -> None:
    # "durable": every job; "sync": every deferred one (a debounced job is one)
    delay = None if dial == "durable" else 60

    async def adds(q: Any) -> tuple[str, str, str]:
        async def add(*args: Any, **kwargs: Any) -> str:
            out = q.add(*args, **kwargs)
            return await out if asyncio.iscoroutine(out) else out

        expiring = await add("e", {}, expires=600, delay=delay)
        first = await add("d", {"n": 1}, debounce="k", debounce_s=30)
        again = await add("d", {"n": 2}, debounce="k", debounce_s=30)
        return expiring, first, again

    name = f"edf-{dial}-{producer}"
    if producer == "sync":
        q: Any = echomq.Queue(name, redis_url=server.url, floor=floor_url, durability=dial)
        expiring, first, again = asyncio.run(adds(q))
        q.floor.dispose()
    else:
        async def main() -> tuple[str, str, str]:
            aq = echomq.aio.Queue(name, redis_url=server.url, floor=floor_url,
                                  durability=dial)
            try:
                return await adds(aq)
            finally:
                await aq.close()

        expiring, first, again = asyncio.run(main())
    assert first == again  # one job gathered both payloads
    rows = {r.job_id: r for r in floor.open_rows(name, None, 10)}
    assert set(rows) == {expiring, first}
    assert rows[expiring].fields.get("expires_ms")
    assert [p["n"] for p in json.loads(rows[first].fields["payloads"])] == [1, 2]


@pytest.mark.parametrize("producer", ["sync", "asyncio"])
def test_a_debounced_job_s_row_is_the_newest_when_two_adds_race(
        floor: Floor, server: LocalRedis, producer: str) -> None:
    # the first add reads the job's hash, then (held here, in its floor write) a second
    # add gathers into the job and writes its newer row first: the first add's older row
    # must not be the one left
    client = redis.Redis.from_url(server.url)
    name = f"debrace-{producer}"
    other = echomq.Queue(name, redis=client, floor=floor, durability="durable")
    real = floor.write_through
    raced: list[str] = []
    held = threading.Event()

    def racing(queue: str, rows: Any, conn: Any = None) -> int:
        if not held.is_set():  # the first add's first write: the second add goes first
            held.set()
            raced.append(other.add("d", {"n": 2}, debounce="k", debounce_s=30))
        return real(queue, rows, conn)

    floor.write_through = racing  # type: ignore[method-assign]
    if producer == "sync":
        first = echomq.Queue(name, redis=client, floor=floor, durability="durable").add(
            "d", {"n": 1}, debounce="k", debounce_s=30)
    else:
        async def main() -> str:
            aq = echomq.aio.Queue(name, redis_url=server.url, floor=floor,
                                  durability="durable")
            try:
                return await aq.add("d", {"n": 1}, debounce="k", debounce_s=30)
            finally:
                await aq.close()

        first = asyncio.run(main())
    assert raced == [first]
    [row] = floor.open_rows(name, None, 10)
    assert [p["n"] for p in json.loads(row.fields["payloads"])] == [1, 2]


def test_a_job_s_current_row_is_written_in_any_live_state(floor: Floor,
                                                          server: LocalRedis) -> None:
    # a debounced job a beat promoted already (waiting, or active) still gets its row
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("current", redis=client)
    waiting = q.add("j", {})
    active = q.add("j", {})
    done = q.add("j", {})
    lanes = Lanes(client, q.keys, q.settings)
    claimed = {c.id: c for c in lanes.claim(3)}
    client.rpush(q.keys.lane("default"), waiting)  # back on its lane, as claimed never
    client.hset(q.keys.job(waiting), "state", "waiting")
    lanes.settle([Outcome(done, claimed[done].token, "c", "null", 0)])
    for job_id in (waiting, active, done):
        write_current(client, q.keys, floor, job_id)
    rows = {r.job_id: r.fields["state"] for r in floor.open_rows("current", None, 10)}
    assert rows == {waiting: "waiting", active: "active"}


def test_a_job_whose_valkey_data_is_lost_right_after_its_admit_still_gets_its_row(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    from echomq import durable

    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("race", redis=client, floor=floor, durability="durable")
    real = durable.MARK

    class FlushFirst:
        """A hook: Valkey loses its data between the admit and the mark."""

        def __call__(self, c: redis.Redis, keys: list[str], args: list[object]) -> object:
            c.flushall()
            return real(c, keys, args)

    monkeypatch.setattr(durable, "MARK", FlushFirst())
    now, later = q.add_many([("j", {"i": 1}, {"lane": "x", "priority": 3}),
                             ("j", {"i": 2}, {"delay": 600})])
    monkeypatch.setattr(durable, "MARK", real)
    rows = {r.job_id: r for r in floor.open_rows("race", None, 10)}
    assert set(rows) == {now, later}
    assert rows[now].fields["state"] == "waiting" and rows[now].fields["lane"] == "x"
    assert rows[later].fields["state"] == "scheduled"
    _tick(_scheduler(client, floor, "race"))  # the epoch is gone: rehydration
    assert client.lrange(q.keys.lane("x", 3), 0, -1) == [now.encode()]
    job = q.get(now)
    assert job is not None and job.payload == {"i": 1} and job.priority == 3
    assert q.get(later) is not None and q.get(later).state == "scheduled"
