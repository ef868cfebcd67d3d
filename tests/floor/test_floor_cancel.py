"""Cancelling a scheduled job that was folded onto the floor (or spilled to it) drops its
floor row too."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from beats import tick as _tick
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq.floor import Floor


def test_cancel_scheduled_job_closes_its_floor_row(floor: Floor, redis_url: str,
                                                   queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    client.hset(q.keys.meta, "fold", "1")
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=3600)
    _tick(sched)
    kept, gone = q.add("x", 1, delay=600), q.add("x", 2, delay=600)
    _tick(sched)
    assert {r.job_id for r in floor.open_rows(queue_name, None, 10)} == {kept, gone}
    assert q.cancel(gone) is True
    _tick(sched)
    assert {r.job_id for r in floor.open_rows(queue_name, None, 10)} == {kept}
    assert q.get(gone).state == "cancelled"  # type: ignore[union-attr]
    sched.close()
    client.close()


def test_cancel_a_spilled_scheduled_job_cancels_it(floor: Floor, redis_url: str,
                                                   queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=60)
    _tick(sched)
    far = q.add("x", 1, delay=7 * 86_400)
    _tick(sched)
    assert client.sismember(q.keys.spilled, far)  # held by the floor alone
    assert q.counts()["scheduled"] == 1
    try:
        assert q.cancel(far) is True
        job = q.get(far)
        assert job is not None and job.state == "cancelled"
    finally:
        sched.close()
        client.close()


def _spilled_job(client: redis.Redis, q: echomq.Queue, sched: Scheduler) -> str:
    """A scheduled job a week away, spilled by the scheduler (held by the floor alone)."""
    _tick(sched)
    far = q.add("x", {"far": True}, delay=7 * 86_400)
    _tick(sched)
    assert client.sismember(q.keys.spilled, far)
    assert client.hget(q.keys.job(far), "spilled") == b"1"  # a stub, its payload on the floor
    assert not client.hexists(q.keys.job(far), "payload")
    return far


def _restore_everything(sched: Scheduler, floor: Floor, queue: str) -> int:
    """The scheduler's restore pass, with a window reaching past every due time."""
    assert sched.fence is not None
    return floor.restore_due(queue, 2**62, 100, sched.fence, sched._apply("spilled"))


def test_a_cancelled_spilled_job_is_counted_closed_and_never_restored(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=60)
    try:
        far = _spilled_job(client, q, sched)
        assert (q.stats()["scheduled"], q.stats()["spilled"]) == (1, 1)
        assert q.cancel(far) is True
        assert q.cancel(far) is False  # already finished: cancelled
        stats = q.stats()
        assert (stats["scheduled"], stats["spilled"], stats["cancelled"]) == (0, 0, 1)
        assert [j.id for j in q.jobs("cancelled")] == [far]
        stub = q.get(far)
        assert stub is not None
        assert (stub.state, stub.name, stub.payload) == ("cancelled", "x", None)
        _tick(sched)
        assert floor.open_rows(queue_name, None, 10) == []  # its floor row is closed
        # ... once its fields, kept by the floor, were copied into the cancelled hash
        job = q.get(far)
        assert job is not None
        assert (job.state, job.name, job.payload, job.error) == (
            "cancelled", "x", {"far": True}, "cancelled")
        assert not client.hexists(q.keys.job(far), "spilled")
        q.add("x", 2, delay=7 * 86_400)  # another spilled job, so a restore pass has work
        _tick(sched)
        assert _restore_everything(sched, floor, queue_name) == 1
        assert q.get(far).state == "cancelled"  # type: ignore[union-attr]
        assert not client.zscore(q.keys.schedule, far)
    finally:
        sched.close()
        client.close()


def test_a_cancel_between_the_restore_read_and_its_script_wins(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    """The restore has read the spilled row (its floor transaction is open) when the
    cancel lands: the restore script, fenced by the spilled set, leaves the job alone."""
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=60)
    try:
        far = _spilled_job(client, q, sched)
        real = sched._apply("spilled")
        answers = []

        def cancel_first(rows: list[echomq.floor.FloorRow]) -> None:
            assert [r.job_id for r in rows] == [far]
            answers.append(q.cancel(far))  # the race, forced: after the read, before restore
            real(rows)

        assert sched.fence is not None
        floor.restore_due(queue_name, 2**62, 100, sched.fence, cancel_first)
        assert answers == [True]
        assert q.get(far).state == "cancelled"  # type: ignore[union-attr]
        assert client.zscore(q.keys.schedule, far) is None
        assert q.stats()["scheduled"] == 0
        _tick(sched)
        assert floor.open_rows(queue_name, None, 10) == []
    finally:
        sched.close()
        client.close()


def test_a_purged_cancelled_spilled_job_is_still_never_restored(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    """The fence is the spilled set, not the cancelled hash: purging the hash before the
    scheduler closes the floor row does not bring the job back."""
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=60)
    try:
        far = _spilled_job(client, q, sched)
        assert q.cancel(far) is True
        assert q.purge("cancelled") == 1
        assert _restore_everything(sched, floor, queue_name) == 1  # read, then left alone
        assert q.get(far) is None and client.zscore(q.keys.schedule, far) is None
        assert q.stats()["scheduled"] == 0
        _tick(sched)
        assert floor.open_rows(queue_name, None, 10) == []
        assert q.get(far) is None  # the close did not bring the purged hash back
    finally:
        sched.close()
        client.close()


def test_asyncio_and_cli_cancel_spilled_jobs(floor: Floor, redis_url: str,
                                             queue_name: str) -> None:
    import asyncio
    import json
    import subprocess
    import sys

    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=60)
    try:
        by_aio, by_cli = _spilled_job(client, q, sched), _spilled_job(client, q, sched)

        async def cancel() -> bool:
            aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
            try:
                return await aq.cancel(by_aio)
            finally:
                await aq.close()

        assert asyncio.run(cancel()) is True
        proc = subprocess.run(
            [sys.executable, "-m", "echomq.ops.cli", "--redis-url", redis_url, "cancel",
             queue_name, by_cli, "--json"], capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["cancelled"] is True
        assert {j.id for j in q.jobs("cancelled")} == {by_aio, by_cli}
        assert (q.stats()["scheduled"], q.stats()["spilled"]) == (0, 0)
        _tick(sched)
        assert floor.open_rows(queue_name, None, 10) == []
    finally:
        sched.close()
        client.close()


@pytest.mark.parametrize("producer", ["sync", "asyncio"])
def test_a_cancelled_spilled_job_stays_cancelled_through_valkey_restarting_empty(
        floor: Floor, server: LocalRedis, producer: str) -> None:
    # a producer with the floor drops the row before cancel() returns: no scheduler beat
    # runs between the cancel and Valkey losing its data
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("cs", redis=client, floor=floor)
    sched = Scheduler("cs", client, floor, beat_ms=100, horizon_s=60)
    far = _spilled_job(client, q, sched)
    if producer == "sync":
        assert q.cancel(far) is True
    else:
        async def cancel() -> bool:
            aq = echomq.aio.Queue("cs", redis_url=server.url, floor=floor)
            try:
                return await aq.cancel(far)
            finally:
                await aq.close()
        assert asyncio.run(cancel()) is True
    job = q.get(far)  # the floor row's fields were copied in before the row went
    assert job is not None and job.state == "cancelled" and job.name != "(unknown)"
    assert floor.rows("cs", [far]) == []
    sched.close()
    client.close()
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("cs", redis=client2)
    sched2 = Scheduler("cs", client2, floor, beat_ms=100, horizon_s=60)
    try:
        _tick(sched2)  # the epoch is gone: rehydration from the floor's open rows
        job = q2.get(far)
        assert job is None or job.state == "cancelled"
        assert not client2.sismember(q2.keys.spilled, far)  # nor waiting to be restored
    finally:
        sched2.close()
        client2.close()


def test_a_job_id_added_again_after_a_cancel_and_purge_keeps_its_floor_row(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    """Cancel a spilled job, purge it and add a deferred job with the same id before the
    scheduler's next beat: that beat folds the new job, then works through the closed log
    the cancel appended to. The close is the old job's: the new job's row must stay."""
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=60)
    try:
        _tick(sched)
        far = q.add("x", {"old": True}, delay=7 * 86_400, job_id="reused-1")
        _tick(sched)
        assert client.sismember(q.keys.spilled, far)
        assert q.cancel(far) is True
        assert q.purge("cancelled") == 1
        assert q.add("x", {"new": True}, delay=30, job_id="reused-1") == far
        _tick(sched)
        (row,) = floor.open_rows(queue_name, None, 10)
        assert row.job_id == far and json.loads(row.fields["payload"]) == {"new": True}
        assert q.get(far).state == "scheduled"  # type: ignore[union-attr]
    finally:
        sched.close()
        client.close()
