"""Operations on a queue: pause/resume, cancel, listing with a cursor, purge, lane survey."""

from __future__ import annotations

import time

import pytest
import redis

import echomq
from echomq.lanes import Lanes, Outcome


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def test_a_paused_queue_admits_but_claims_nothing(redis_url: str, queue_name: str,
                                                  r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.pause() is True and q.pause() is False and q.is_paused()
    r.delete(q.keys.wake)
    q.add_many([("x", i) for i in range(5)])
    assert q.counts()["waiting"] == 5
    assert r.llen(q.keys.wake) == 0, "admit rang while paused: parked consumers would wake"
    assert _lanes(q).claim(5) == []
    assert q.stats()["paused"] is True
    assert q.resume() is True and q.resume() is False and not q.is_paused()
    assert r.llen(q.keys.wake) == 1, "resume must ring when jobs wait"
    assert len(_lanes(q).claim(5)) == 5
    assert q.stats()["paused"] is False


def test_resume_of_an_empty_queue_does_not_ring(redis_url: str, queue_name: str,
                                                r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.pause()
    assert q.resume() and r.llen(q.keys.wake) == 0


def test_cancel_waiting_job_leaves_its_lane_and_the_ring(redis_url: str, queue_name: str,
                                                        r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    keep = q.add("x", 1, lane="a")
    gone = q.add("x", 2, lane="b")
    assert q.cancel(gone) is True
    job = q.get(gone)
    assert job is not None and job.state == "cancelled" and job.finished_ms
    assert r.lrange(q.keys.ring, 0, -1) == [b"a"]
    assert q.counts()["waiting"] == 1 and q.counts()["cancelled"] == 1
    claimed = _lanes(q).claim(5)
    assert [c.id for c in claimed] == [keep]
    assert q.cancel(gone) is False, "a cancelled job cannot be cancelled again"


def test_cancel_scheduled_job_leaves_the_schedule(redis_url: str, queue_name: str,
                                                  r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1, delay=60)
    assert q.cancel(jid) is True
    assert r.zscore(q.keys.schedule, jid) is None
    assert q.counts()["scheduled"] == 0 and q.jobs("cancelled")[0].id == jid


def test_cancel_is_refused_for_finished_and_unknown_jobs(redis_url: str,
                                                         queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("x", 1)
    [claimed] = _lanes(q).claim(1)
    _lanes(q).settle([Outcome(claimed.id, claimed.token, "c")])
    assert q.cancel(jid) is False and q.get(jid).state == "completed"  # type: ignore[union-attr]
    assert q.cancel("no-such-job") is False
    with pytest.raises(echomq.InvalidName):
        q.cancel("bad id")


def test_jobs_pages_through_every_state_with_a_cursor(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", i, {"lane": f"l{i % 3}"}) for i in range(25)])
    seen: list[str] = []
    cursor = ""
    while True:
        page, cursor = q.jobs_page("waiting", limit=7, cursor=cursor)
        assert len(page) <= 7
        seen += [j.id for j in page]
        if not cursor:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 25
    assert all(j.state == "waiting" for j in q.jobs("waiting", limit=100))
    later = q.add_many([("y", i, {"delay": 60 + i}) for i in range(12)])
    first, cursor = q.jobs_page("scheduled", limit=10)
    rest, end = q.jobs_page("scheduled", limit=10, cursor=cursor)
    assert [j.id for j in first + rest] == later and end == ""
    assert q.jobs("active") == [] and q.jobs("dead") == []
    with pytest.raises(ValueError):
        q.jobs("nonsense")
    with pytest.raises(ValueError):
        q.jobs_page("waiting", cursor="1;2")


def test_jobs_costs_o_limit_on_a_long_lane(redis_url: str, queue_name: str) -> None:
    """200,000 waiting jobs; the first 100 come back quickly (figure in bench/ops.py)."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    for start in range(0, 200_000, 20_000):
        q.add_many([("x", None, {"lane": f"l{(start + i) % 50}"}) for i in range(20_000)])
    assert q.counts()["waiting"] == 200_000
    t0 = time.perf_counter()
    page = q.jobs("waiting", limit=100)
    elapsed = time.perf_counter() - t0
    assert len(page) == 100
    assert elapsed < 0.5, f"listing 100 of 200,000 took {elapsed * 1000:.0f} ms"
    q.redis.delete(*[q.keys.lane(f"l{i}") for i in range(50)], q.keys.ring)


def test_purge_deletes_a_finished_state(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", i) for i in range(3)])
    for jid in ids:
        q.cancel(jid)
    assert q.purge("cancelled") == 3
    assert q.counts()["cancelled"] == 0 and all(q.get(j) is None for j in ids)
    with pytest.raises(ValueError):
        q.purge("waiting")


def test_lane_survey_finds_the_busiest_lanes(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", 0, {"lane": "small"})] + [("x", i, {"lane": "big"}) for i in range(5)]
               + [("x", i, {"lane": "mid"}) for i in range(3)])
    survey = q.lanes(top=2)
    assert survey["lanes"] == 3 and survey["scanned"] == 3
    assert survey["busiest"] == [("big", 5), ("mid", 3)]
    assert q.lanes(top=5, scan=2)["busiest"] == [("big", 5), ("small", 1)]
    assert survey["oldest_waiting_s"] is not None and survey["oldest_waiting_s"] >= 0


def test_registry_names_queues_that_admitted(redis_url: str, queue_name: str,
                                             r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", 1)
    assert queue_name in echomq.Queue.registered(r)


def test_listing_skips_a_hash_without_its_fields(redis_url: str, queue_name: str,
                                                 r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    good = q.add("x", 1)
    r.hset(q.keys.job("broken"), "payload", "not json")
    r.rpush(q.keys.lane("default"), "broken")
    assert [j.id for j in q.jobs("waiting")] == [good]


def test_a_cancelled_retrying_job_reports_cancelled_not_its_old_error(
        redis_url: str, queue_name: str) -> None:

    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {}, max_attempts=3)
    lanes = Lanes(q.redis, q.keys, q.settings)
    [claimed] = lanes.claim(1)
    lanes.settle([Outcome(claimed.id, claimed.token, "f", "Traceback: boom", 60_000)])
    assert q.get(job_id).state == "scheduled"  # type: ignore[union-attr]
    assert q.cancel(job_id) is True
    with pytest.raises(echomq.JobFailed) as info:
        q.result(job_id, timeout=1)
    assert "cancelled" in info.value.error and "boom" not in info.value.error
