"""The wire protocol's version in the queue's meta: recorded at first use, checked by
every client, another MAJOR refused before anything is admitted."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import redis

import echomq
from echomq import protocol
from echomq.errors import ProtocolMismatch
from echomq.keys import Keys


def test_first_add_records_the_protocol_version(redis_url: str, r: redis.Redis,
                                                queue_name: str) -> None:
    echomq.Queue(queue_name, redis_url=redis_url).add("a", {})
    assert r.hget(Keys(queue_name).meta, "protocol") == protocol.PROTOCOL_VERSION.encode()


def test_another_minor_is_accepted_and_kept(redis_url: str, r: redis.Redis,
                                            queue_name: str) -> None:
    r.hset(Keys(queue_name).meta, "protocol", "1.99")
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("a", {})
    assert q.counts()["waiting"] == 1
    assert r.hget(Keys(queue_name).meta, "protocol") == b"1.99"


@pytest.mark.parametrize("recorded", ["2.0", "0.9", "garbage"])
def test_another_major_is_refused_and_nothing_admitted(redis_url: str, r: redis.Redis,
                                                       queue_name: str, recorded: str) -> None:
    keys = Keys(queue_name)
    r.hset(keys.meta, "protocol", recorded)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ProtocolMismatch, match=rf"speaks protocol '{recorded}'.*this client "
                                               rf"speaks {protocol.PROTOCOL_VERSION}"):
        q.add("a", {"x": 1})
    with pytest.raises(ProtocolMismatch):
        q.add_many([("a", {}), ("b", {})])
    assert r.exists(keys.ring, keys.lane("default"), keys.schedule) == 0
    with pytest.raises(ProtocolMismatch):
        echomq.Queue(queue_name, redis_url=redis_url).get("some-id")
    with pytest.raises(ProtocolMismatch):
        echomq.Queue(queue_name, redis_url=redis_url).counts()
    with pytest.raises(ProtocolMismatch):
        echomq.Queue(queue_name, redis_url=redis_url).result("some-id", timeout=0)
    assert r.hget(keys.meta, "protocol") == recorded.encode()


def test_asyncio_queue_refuses_another_major(redis_url: str, r: redis.Redis,
                                                queue_name: str) -> None:
    keys = Keys(queue_name)
    r.hset(keys.meta, "protocol", "2.0")

    async def main() -> None:
        q = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            with pytest.raises(ProtocolMismatch):
                await q.add("a", {})
            with pytest.raises(ProtocolMismatch):
                await q.get("some-id")
            with pytest.raises(ProtocolMismatch):
                await q.counts()
            with pytest.raises(ProtocolMismatch):
                await q.result("some-id", timeout=0)
        finally:
            await q.close()

    asyncio.run(main())
    assert r.exists(keys.ring, keys.lane("default")) == 0


def test_consumer_refuses_another_major(redis_url: str, r: redis.Redis,
                                        queue_name: str) -> None:
    r.hset(Keys(queue_name).meta, "protocol", "3.1")
    consumer = echomq.Consumer(queue_name, lambda job: None, redis_url=redis_url)
    with pytest.raises(ProtocolMismatch):
        consumer.run(burst=True)


def test_supervisor_refuses_another_major_at_start(redis_url: str, r: redis.Redis,
                                                   queue_name: str) -> None:
    r.hset(Keys(queue_name).meta, "protocol", "2.0")
    done = subprocess.run(
        [sys.executable, "-m", "echomq.supervisor.cli", "start", "--redis-url", redis_url,
         "--queue", queue_name, "--handler", "echomq.supervisor.drills.handler:handle"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 1, done.stderr
    assert f"queue {queue_name!r} speaks protocol '2.0'" in done.stderr
    assert "Traceback" not in done.stderr
