"""The durability dial belongs to the queue: its supervisor records it in the queue's
meta, and every producer reads it there. A producer that cannot honour "sync" (no
floor) refuses loudly instead of silently admitting deferred jobs as "folded"."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.settings import QueueSpec, Settings

import echomq
from echomq.errors import ConfigError
from echomq.floor import Floor


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[Floor]:
    floor = Floor.from_url(f"sqlite:///{tmp_path / 'floor.db'}")
    floor.upgrade()
    yield floor
    floor.dispose()


def _supervisor_records(redis_url: str, queue: str, durability: str, floor_url: str) -> None:
    """What `echomq-supervisor start --durability ...` writes for its queue at start."""
    settings = Settings(redis_url=redis_url, floor_url=floor_url, queues=(
        QueueSpec(name=queue, handler="json:dumps", durability=durability),))
    arbiter = Arbiter(settings)
    arbiter._prepare_queue(arbiter.queues[queue])
    arbiter.client.close()


def test_a_producer_of_a_sync_queue_without_a_floor_fails_loudly(
        redis_url: str, queue_name: str, floor: Floor) -> None:
    _supervisor_records(redis_url, queue_name, "sync", "sqlite:///unused.db")
    q = echomq.Queue(queue_name, redis_url=redis_url)  # its own settings say nothing
    with pytest.raises(ConfigError, match=r"durability 'sync'.*no floor.*nothing was admitted"):
        q.add("send", {}, delay=60)
    with pytest.raises(ConfigError, match="durability 'sync'"):
        q.add_many([("send", {}), ("send", {}, {"delay": 60})])
    assert q.counts() == {"waiting": 0, "scheduled": 0, "active": 0, "completed": 0, "dead": 0,
                          "cancelled": 0, "blocked": 0}
    q.add("send", {})  # a job due now never waits on the floor: the dial does not apply
    assert q.counts()["waiting"] == 1


def test_a_producer_with_a_floor_writes_through_when_the_queue_says_sync(
        redis_url: str, queue_name: str, floor: Floor) -> None:
    _supervisor_records(redis_url, queue_name, "sync", "sqlite:///unused.db")
    q = echomq.Queue(queue_name, redis_url=redis_url, floor=floor)
    job_id = q.add("send", {"n": 1}, delay=3600)
    [batch_id] = q.add_many([("send", {"n": 2}, {"delay": 3600})])
    rows = {row.job_id: row for row in floor.open_rows(queue_name, None, 10)}
    assert set(rows) == {job_id, batch_id}  # on the floor before add() returned
    assert rows[job_id].fields["state"] == "scheduled"


def test_a_folded_queue_admits_deferred_jobs_without_a_floor(
        redis_url: str, queue_name: str, floor: Floor) -> None:
    _supervisor_records(redis_url, queue_name, "folded", "sqlite:///unused.db")
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("send", {}, delay=3600)
    assert q.counts()["scheduled"] == 1


def test_a_producer_asking_for_sync_itself_is_held_to_it(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, durability="sync")
    with pytest.raises(ConfigError, match="no floor"):
        q.add("send", {}, delay=60)


def test_a_running_producer_learns_a_new_dial_within_its_ttl(
        redis_url: str, queue_name: str, floor: Floor, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import echomq.admit

    monkeypatch.setattr(echomq.admit, "DIAL_TTL_S", 0.2)
    _supervisor_records(redis_url, queue_name, "folded", "sqlite:///unused.db")
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("send", {}, delay=3600)  # reads "folded" and trusts it for the TTL
    _supervisor_records(redis_url, queue_name, "sync", "sqlite:///unused.db")
    threading.Event().wait(0.3)  # let the producer's reading of the dial age past its TTL
    with pytest.raises(ConfigError, match="durability 'sync'"):
        q.add("send", {}, delay=3600)


def test_an_asyncio_producer_of_a_sync_queue_without_a_floor_fails_loudly(
        redis_url: str, queue_name: str) -> None:
    _supervisor_records(redis_url, queue_name, "sync", "sqlite:///unused.db")

    async def add() -> None:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            await aq.add("send", {}, delay=60)
        finally:
            await aq.close()

    with pytest.raises(ConfigError, match="durability 'sync'"):
        asyncio.run(add())
    assert echomq.Queue(queue_name, redis_url=redis_url).counts()["scheduled"] == 0
