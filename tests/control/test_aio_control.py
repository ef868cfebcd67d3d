"""The asyncio producer: expires, debounce and the queue-wide limit, as the sync one."""

from __future__ import annotations

import asyncio

import pytest

import echomq
from echomq.debouncing import DebounceClash
from echomq.expiry import expiring_key


def test_aio_add_with_expires_debounce_and_a_queue_limit(redis_url: str,
                                                         queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)

    async def go() -> tuple[str, list[str]]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            expiring = await aq.add("x", 1, expires=60)
            gathered = [await aq.add("d", i, debounce="k", debounce_s=30) for i in range(3)]
            with pytest.raises(DebounceClash):
                await aq.add("d", 9, debounce="k", debounce_s=30, job_id=expiring)
            with pytest.raises(ValueError):
                await aq.add("x", 1, expires=-1)
            await aq.set_queue_limit(max_active=3)
            return expiring, gathered
        finally:
            await aq.close()

    expiring, gathered = asyncio.run(go())
    assert q.redis.zscore(expiring_key(q.keys), expiring) is not None
    assert len(set(gathered)) == 1
    assert q.get(gathered[0]).payloads == [0, 1, 2]  # type: ignore[union-attr]
    assert q.queue_limit()["max_active"] == 3
    assert q.counts()["waiting"] == 1 and q.counts()["scheduled"] == 1
