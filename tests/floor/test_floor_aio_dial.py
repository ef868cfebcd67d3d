"""The asyncio producer honours the durability dial as the sync one does: on a "sync"
queue a deferred job's floor row exists when ``await aq.add(...)`` returns."""

from __future__ import annotations

import asyncio

import pytest
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.settings import QueueSpec, Settings

import echomq
from echomq.errors import ConfigError
from echomq.floor import Floor


def _record_dial(redis_url: str, queue: str, durability: str) -> None:
    """What `echomq-supervisor start --durability ...` writes for its queue at start."""
    settings = Settings(redis_url=redis_url, floor_url="sqlite:///unused.db", queues=(
        QueueSpec(name=queue, handler="json:dumps", durability=durability),))
    arbiter = Arbiter(settings)
    arbiter._prepare_queue(arbiter.queues[queue])
    arbiter.client.close()


def _open(floor: Floor, queue: str) -> dict[str, str]:
    return {row.job_id: row.fields["state"] for row in floor.open_rows(queue, None, 100)}


def test_sync_and_asyncio_producers_write_deferred_jobs_through_alike(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    _record_dial(redis_url, queue_name, "sync")
    q = echomq.Queue(queue_name, redis_url=redis_url, floor=floor)
    sync_id = q.add("send", {"n": 1}, delay=3600)
    seen_sync = _open(floor, queue_name)

    async def main() -> tuple[dict[str, str], dict[str, str], list[str], str]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url, floor=floor)
        try:
            one = await aq.add("send", {"n": 2}, delay=3600)
            after_add = _open(floor, queue_name)  # read before anything else runs
            many = await aq.add_many([("send", {"n": 3}, {"delay": 3600}), ("send", {"n": 4})])
            after_many = _open(floor, queue_name)
            return after_add, after_many, many, one
        finally:
            await aq.close()

    after_add, after_many, many, one = asyncio.run(main())
    q.close()
    assert seen_sync == {sync_id: "scheduled"}
    assert after_add == {sync_id: "scheduled", one: "scheduled"}
    # the deferred job of add_many is on the floor; the one due now never goes there
    assert after_many == {sync_id: "scheduled", one: "scheduled", many[0]: "scheduled"}


def test_concurrent_asyncio_adds_of_a_sync_queue_are_all_on_the_floor(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    _record_dial(redis_url, queue_name, "sync")

    async def main() -> tuple[list[str], list[dict[str, str]]]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url, floor=floor)

        async def add(i: int) -> tuple[str, dict[str, str]]:
            job_id = await aq.add("send", i, delay=3600 + i)
            return job_id, _open(floor, queue_name)

        try:
            pairs = await asyncio.gather(*(add(i) for i in range(100)))
        finally:
            await aq.close()
        return [p[0] for p in pairs], [p[1] for p in pairs]

    ids, seen = asyncio.run(main())
    assert all(job_id in rows for job_id, rows in zip(ids, seen, strict=True))
    assert set(_open(floor, queue_name)) == set(ids)


def test_an_asyncio_producer_without_a_floor_refuses_deferred_add_many(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    _record_dial(redis_url, queue_name, "sync")

    async def main() -> dict[str, int]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            with pytest.raises(ConfigError, match="durability 'sync'"):
                await aq.add_many([("send", {}), ("send", {}, {"delay": 60})])
            await aq.add("send", {})  # due now: the dial does not apply
            return await aq.counts()
        finally:
            await aq.close()

    counts = asyncio.run(main())
    assert (counts["waiting"], counts["scheduled"]) == (1, 0)
