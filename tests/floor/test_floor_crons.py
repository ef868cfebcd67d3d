"""Crons on the floor, on both backends: the store's cron rows, the scheduler's copy of
Valkey's crons, and crons coming back after Valkey restarts empty."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq import cron
from echomq.errors import StaleFence
from echomq.floor import Floor


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    srv = LocalRedis().start()
    yield srv
    srv.stop()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Re-check (here: tick the scheduler and look) until it holds, or fail at the deadline;
    the occurrences come with the server's clock, every second."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


def _tick(s: Scheduler) -> None:
    s.floor_retry_at = 0.0
    s.tick(time.monotonic())


def test_store_puts_drops_and_records_the_last_occurrence(floor: Floor) -> None:
    floor.put_crons("q", [("a", "A", 10), ("b", "B", 20)], None)
    floor.put_crons("other", [("a", "X", 1)], None)
    floor.put_crons("q", [("a", "A2", 5)], None)  # replaced spec; the later last stays
    assert floor.cron_rows("q") == [("a", "A2", 10), ("b", "B", 20)]
    floor.crons_fired("q", {"a": 30, "b": 15}, fence=7)  # never moves a last back
    assert floor.cron_rows("q") == [("a", "A2", 30), ("b", "B", 20)]
    floor.put_crons("q", [("b", "B", 20), ("c", "C", 1)], 7, only=True)  # the mirror
    assert [k for k, _, _ in floor.cron_rows("q")] == ["b", "c"]
    assert floor.drop_crons("q", ["b", "zz"]) == 1
    assert floor.cron_rows("other") == [("a", "X", 1)]
    with pytest.raises(StaleFence):
        floor.put_crons("q", [], 6, only=True)
    assert [k for k, _, _ in floor.cron_rows("q")] == ["c"]


def test_producer_with_a_floor_writes_crons_through(floor: Floor, redis_url: str,
                                                     queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, floor=floor)
    added = q.add_cron("nightly", "0 3 * * *", "report", {"a": 1})
    ((key, spec, last),) = floor.cron_rows(queue_name)
    assert key == "nightly" and last == added.last_ms
    assert cron.CronSpec.decode(key, spec).expr == "0 3 * * *"
    assert q.remove_cron("nightly") is True
    assert floor.cron_rows(queue_name) == []


def test_the_scheduler_copies_valkeys_crons_to_the_floor(floor: Floor, redis_url: str,
                                                         queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)  # no floor of its own
    q.add_cron("a", "0 3 * * *", "x")
    q.add_cron("b", "*/5 * * * *", "y")
    sched = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=3600)
    _tick(sched)
    assert [k for k, _, _ in floor.cron_rows(queue_name)] == ["a", "b"]
    q.remove_cron("a")
    _tick(sched)
    assert [k for k, _, _ in floor.cron_rows(queue_name)] == ["b"]


def test_crons_survive_valkey_restarting_empty(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("cq", redis=client)
    sched = Scheduler("cq", client, floor, beat_ms=100, horizon_s=3600)
    _tick(sched)
    q.add_cron("tick", "* * * * * *", "beat", {"n": 1}, lane="cl")
    q.add_cron("nightly", "0 3 * * *", "report")

    def fired() -> list[str]:
        return sorted(j.id for j in q.jobs("waiting", limit=1000))

    wait_until(lambda: _tick(sched) or len(fired()) >= 2, 10, "two occurrences")
    before = {c.key: c for c in q.crons()}
    recorded = dict((k, last) for k, _, last in floor.cron_rows("cq"))
    assert recorded["tick"] == before["tick"].last_ms

    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    q2 = echomq.Queue("cq", redis=client2)
    assert q2.crons() == []
    sched2 = Scheduler("cq", client2, floor, beat_ms=100, horizon_s=3600)
    _tick(sched2)  # finds the epoch gone: the crons come back before anything runs
    after = {c.key: c for c in q2.crons()}
    assert set(after) == {"tick", "nightly"}
    assert (after["tick"].expr, after["tick"].payload, after["tick"].lane) == (
        "* * * * * *", {"n": 1}, "cl")
    assert after["tick"].last_ms >= recorded["tick"]  # type: ignore[operator]
    # occurrences go on, none admitted twice: every id is later than the floor's last
    wait_until(lambda: _tick(sched2) or q2.counts()["waiting"] >= 2, 10, "occurrences")
    dues = [int(j.id.rsplit(":", 1)[1]) for j in q2.jobs("waiting", limit=1000)]
    assert all(due > recorded["tick"] for due in dues)
    assert len(dues) == len(set(dues))


def test_a_floored_scheduler_takes_the_lead_from_one_for_crons_alone(
        floor: Floor, redis_url: str, queue_name: str) -> None:
    """A supervisor without a floor leads a queue that has crons; one with the floor
    joining the same queue must not stand by behind it (no fold, no restore of spilled
    jobs, no rehydration for as long as the floor-less one lives)."""
    client = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=client)
    q.add_cron("nightly", "0 3 * * *", "report")
    crons_alone = Scheduler(queue_name, client, None, beat_ms=100, horizon_s=3600)
    _tick(crons_alone)
    assert crons_alone.fence is not None  # the queue has a cron: it leads
    q.add("later", {}, delay=60, job_id="later-1")  # deferred: the floor must get it
    floored = Scheduler(queue_name, client, floor, beat_ms=100, horizon_s=3600)
    _tick(floored)  # well within the floor-less one's leader lease
    assert floored.fence is not None
    wait_until(lambda: _tick(floored) or floor.count(queue_name) == 1, 10,
               "the deferred job folded by the scheduler with the floor")
    _tick(crons_alone)  # deposed: it stands down and does not take the lead back
    assert crons_alone.fence is None
    _tick(floored)
    assert floored.fence is not None
    assert [k for k, _, _ in floor.cron_rows(queue_name)] == ["nightly"]


def test_a_cron_added_with_the_floor_during_the_mirror_survives_valkey_loss(
        floor: Floor, server: LocalRedis) -> None:
    """The scheduler mirrors Valkey's crons onto the floor (deleting the floor's others)
    from what it read earlier in its beat; a producer with the floor adds a cron between
    that read and the mirror's write. add_cron promised the cron is on the floor when it
    returned: Valkey restarting empty right after must not lose it."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("mq", redis=client, floor=floor)
    q.add_cron("a", "0 3 * * *", "x")
    sched = Scheduler("mq", client, floor, beat_ms=100, horizon_s=3600)
    real = sched.crontab.sync_floor

    def add_first(fence: int) -> None:  # the race, forced: after the read, before the write
        sched.crontab.sync_floor = real  # type: ignore[method-assign]
        q.add_cron("b", "*/5 * * * *", "y")
        real(fence)

    sched.crontab.sync_floor = add_first  # type: ignore[method-assign]
    _tick(sched)
    assert sched.crontab.sync_floor is real  # the hook ran
    sched.close()
    client.close()
    server.restart_empty()
    client2 = redis.Redis.from_url(server.url)
    sched2 = Scheduler("mq", client2, floor, beat_ms=100, horizon_s=3600)
    _tick(sched2)  # the crons come back from the floor
    assert [c.key for c in echomq.Queue("mq", redis=client2).crons()] == ["a", "b"]
    sched2.close()
    client2.close()
