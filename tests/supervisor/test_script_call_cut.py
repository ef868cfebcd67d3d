"""A single script call's own connection cut under it, through the proxy: the call, written
on a pooled connection without redis-py's per-command wrapping, fails as redis-py's own
path fails (never sent twice), and is retried where the client asks redis-py to retry."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

import echomq
from echomq import aio, scripts
from echomq.errors import ConnectionFailed

from .proxy import Proxy, script


def _relay(redis_url: str) -> Proxy:
    target = urlsplit(redis_url)
    return Proxy(target.port or 6379, target.hostname or "127.0.0.1")


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_cut_script_call_raises_once_and_the_next_runs(
        redis_url: str, queue_name: str, r: redis.Redis, when: str) -> None:
    with _relay(redis_url) as relay:
        q = echomq.Queue(queue_name, redis_url=relay.url)
        q.add("x", 1, job_id="first")  # connected, the script loaded
        cut = relay.cut(script(scripts.ADMIT), when=when)
        with pytest.raises(ConnectionFailed):
            q.add("x", 2, job_id="second")
        assert cut.fired.wait(5)
        # "after": the admit ran once, unseen; "before": it never reached the server
        assert r.exists(f"{q.keys.prefix}job:second") == (when == "after")
        assert q.add("x", 2, job_id="second") == "second"  # a new connection
        assert q.counts()["waiting"] == 2
        q.close()


def test_a_client_that_asks_for_retries_gets_redis_pys_retry(
        redis_url: str, queue_name: str) -> None:
    with _relay(redis_url) as relay:
        client = redis.Redis.from_url(relay.url, retry=Retry(NoBackoff(), 2))
        q = echomq.Queue(queue_name, redis=client)
        q.add("x", 1, job_id="first")
        cut = relay.cut(script(scripts.ADMIT), when="before")
        assert q.add("x", 2, job_id="second") == "second"  # retried on a new connection
        assert cut.fired.wait(5)
        assert q.counts()["waiting"] == 2
        client.close()


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_cut_async_script_call_raises_once_and_the_next_runs(
        redis_url: str, queue_name: str, r: redis.Redis, when: str) -> None:
    async def main(url: str) -> None:
        q = aio.Queue(queue_name, redis_url=url)
        await q.add("x", 1, job_id="first")
        cut = relay.cut(script(scripts.ADMIT), when=when)
        with pytest.raises(ConnectionFailed):
            await q.add("x", 2, job_id="second")
        assert cut.fired.wait(5)
        assert r.exists(f"{q.keys.prefix}job:second") == (when == "after")
        assert await q.add("x", 2, job_id="second") == "second"
        assert (await q.counts())["waiting"] == 2
        await q.close()

    with _relay(redis_url) as relay:
        asyncio.run(main(relay.url))


def test_an_async_client_that_asks_for_retries_gets_redis_pys_retry(
        redis_url: str, queue_name: str) -> None:
    async def main(url: str) -> None:
        client = redis.asyncio.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 2))
        q = aio.Queue(queue_name, redis=client)
        await q.add("x", 1, job_id="first")
        cut = relay.cut(script(scripts.ADMIT), when="before")
        assert await q.add("x", 2, job_id="second") == "second"
        assert cut.fired.wait(5)
        assert (await q.counts())["waiting"] == 2
        await client.aclose()

    with _relay(redis_url) as relay:
        asyncio.run(main(relay.url))
