"""A standalone consumer whose stop subscription was cut (a Valkey restart, a dropped
connection) while a job was cancelled: once subscribed again it checks the jobs it holds,
so the cancelled coroutine ends instead of running on."""

from __future__ import annotations

import asyncio
import threading

import redis
from echomq.supervisor.drills.localredis import LocalRedis

import echomq
from echomq.stopping import channel


def _subscribers(r: redis.Redis) -> list[int]:
    return [int(c["id"]) for c in r.client_list() if int(c.get("sub", 0)) > 0]


def _wait(predicate: object, what: str, timeout: float = 10.0) -> None:
    done = threading.Event()
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not predicate():  # type: ignore[operator]
            if deadline.is_set():
                raise AssertionError(f"timed out waiting for {what}")
            done.wait(0.02)
    finally:
        timer.cancel()


def test_a_cancel_missed_while_unsubscribed_still_cancels_the_coroutine(
        private_redis: LocalRedis) -> None:
    url = private_redis.url
    r = redis.Redis.from_url(url)
    q = echomq.Queue("missed", redis_url=url)
    started, cancelled = threading.Event(), threading.Event()

    async def handler(job: echomq.Job) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "finished"

    consumer = echomq.Consumer("missed", handler, redis_url=url, beat_ms=100)
    t = threading.Thread(target=consumer.run, daemon=True)
    t.start()
    jid = q.add("x", {})
    assert started.wait(10)
    _wait(lambda: bool(_subscribers(r)), "the stop subscription")
    maxclients = r.config_get("maxclients")["maxclients"]
    r.config_set("maxclients", len(r.client_list()) - 1)  # no new connection: no resubscribe
    try:
        for cid in _subscribers(r):
            r.client_kill_filter(_id=cid)
        assert r.pubsub_numsub(channel(q.keys))[0][1] == 0
        assert q.cancel(jid) is True  # published to nobody
    finally:
        r.config_set("maxclients", maxclients)
    assert cancelled.wait(15), "the cancelled coroutine ran on"
    consumer.stop()
    t.join(10)
    job = q.get(jid)
    assert job is not None and job.state == "cancelled"
