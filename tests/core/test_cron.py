"""Crons on a real server: add, replace, list and remove them; bad input is refused with
nothing stored; occurrences from five- and six-field expressions; each occurrence is
admitted once by the fire script, as admit would write it."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
import redis

import echomq
from echomq import cron, scripts
from echomq.errors import InvalidName, InvalidSchedule, PayloadError


def _ms(*args: int, tz: object = UTC) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)  # type: ignore[arg-type, misc]


def test_add_list_replace_remove(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    added = q.add_cron("nightly", "0 3 * * *", "report", {"kind": "daily"}, lane="ops",
                       tz="Europe/Paris")
    q.add_cron("tick", "*/10 * * * * *", "ping")
    assert added.key == "nightly" and added.next_ms is not None and added.last_ms is not None
    assert added.next_ms > added.last_ms
    listed = q.crons()
    assert [c.key for c in listed] == ["nightly", "tick"]
    nightly = listed[0]
    assert (nightly.expr, nightly.name, nightly.payload, nightly.lane, nightly.tz) == (
        "0 3 * * *", "report", {"kind": "daily"}, "ops", "Europe/Paris")
    assert listed[1].lane == "default" and listed[1].payload is None and listed[1].tz == "UTC"
    # the next due of "0 3 * * *" in Paris is 03:00 local
    due = datetime.fromtimestamp(nightly.next_ms / 1000,  # type: ignore[operator]
                                 tz=cron.zone("Europe/Paris"))
    assert (due.hour, due.minute, due.second) == (3, 0, 0)

    q.add_cron("nightly", "30 4 * * 1-5", "report2")  # same key: replaced
    assert [(c.key, c.expr, c.name) for c in q.crons()] == [
        ("nightly", "30 4 * * 1-5", "report2"), ("tick", "*/10 * * * * *", "ping")]

    assert q.remove_cron("nightly") is True
    assert q.remove_cron("nightly") is False
    assert [c.key for c in q.crons()] == ["tick"]
    assert queue_name in echomq.Queue.registered(q.redis)


@pytest.mark.parametrize("expr", [
    "* * * *",            # four fields
    "* * * * * * *",      # seven (croniter's year field is not offered)
    "61 * * * *",         # minute out of range
    "* * * * * 75",       # seconds out of range
    "0 0 31 2 *",         # never happens
    "every day",
    "",
    "   ",
    42,
    None,
])
def test_bad_expressions_are_refused_and_nothing_is_stored(
        redis_url: str, queue_name: str, expr: object) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(InvalidSchedule, match="cron expression"):
        q.add_cron("k", expr, "x")  # type: ignore[arg-type]
    assert q.crons() == []
    assert not q.redis.exists(q.keys.crons, q.keys.cronlast)


def test_bad_key_zone_name_lane_payload_are_refused(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_payload_bytes=64)
    with pytest.raises(InvalidName, match="cron key"):
        q.add_cron("has space", "* * * * *", "x")
    with pytest.raises(InvalidName, match="cron key"):
        q.add_cron("{brace}", "* * * * *", "x")
    with pytest.raises(InvalidName, match="cron key"):
        q.add_cron("k" * 129, "* * * * *", "x")
    with pytest.raises(InvalidSchedule, match="time zone"):
        q.add_cron("k", "* * * * *", "x", tz="Mars/Olympus")
    with pytest.raises(InvalidSchedule, match="time zone"):
        q.add_cron("k", "* * * * *", "x", tz="")
    with pytest.raises(InvalidName, match="job name"):
        q.add_cron("k", "* * * * *", "")
    with pytest.raises(InvalidName, match="lane"):
        q.add_cron("k", "* * * * *", "x", lane="a b")
    with pytest.raises(PayloadError):
        q.add_cron("k", "* * * * *", "x", {"big": "x" * 100})
    with pytest.raises(PayloadError):
        q.add_cron("k", "* * * * *", "x", {"set": {1, 2}})
    with pytest.raises(InvalidName, match="cron key"):
        q.remove_cron("a b")
    assert q.crons() == []
    assert not q.redis.exists(q.keys.crons, q.keys.cronlast)


def test_five_field_occurrences() -> None:
    start = _ms(2026, 1, 1, 0, 0, 0)
    assert list(cron.due_between("*/15 * * * *", "UTC", start, start + 3_600_000)) == [
        start + m * 60_000 for m in (15, 30, 45, 60)]
    assert cron.next_after("0 3 * * *", "UTC", start) == _ms(2026, 1, 1, 3, 0, 0)
    # at exactly a due time, that one is the latest; just before, the one before
    assert cron.latest_at("*/15 * * * *", "UTC", start + 900_000) == start + 900_000
    assert cron.latest_at("*/15 * * * *", "UTC", start + 899_999) == start


def test_six_field_expressions_count_seconds() -> None:
    start = _ms(2026, 1, 1, 0, 0, 0)
    assert list(cron.due_between("* * * * * */20", "UTC", start, start + 60_000)) == [
        start + s * 1000 for s in (20, 40, 60)]
    assert list(cron.due_between("* * * * * *", "UTC", start, start + 3000)) == [
        start + 1000, start + 2000, start + 3000]
    assert cron.latest_at("* * * * * 30", "UTC", start + 45_500) == start + 30_000


def test_time_zone_and_daylight_saving() -> None:
    paris = cron.zone("Europe/Paris")
    # 2026-03-29: Paris springs forward at 02:00 -> 03:00; "30 9 * * *" stays 09:30 local
    before = _ms(2026, 3, 27, 12, 0, 0)
    first, second = list(cron.due_between("30 9 * * *", "Europe/Paris", before,
                                          before + 2 * 86_400_000))
    assert second - first == 23 * 3_600_000
    assert datetime.fromtimestamp(second / 1000, tz=paris).hour == 9


def test_fire_admits_each_occurrence_once(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_cron("k", "* * * * * *", "beat", {"n": 1}, lane="cl")
    (spec_text,) = q.redis.hvals(q.keys.crons)
    spec = cron.CronSpec.decode("k", spec_text)
    last = int(q.redis.hget(q.keys.cronlast, "k"))
    dues = [last + 1000, last + 2000]
    fire = [q.keys.prefix, "k", spec.rev]
    assert scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), [*fire, *dues])[0] == 2
    # again, by a second leader or a retried call: nothing
    assert scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), [*fire, *dues])[0] == 0
    assert scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), [*fire, dues[0]])[0] == 0
    assert q.counts()["waiting"] == 2
    job = q.get(cron.job_id("k", dues[1]))
    assert job is not None and job.payload == {"n": 1} and job.lane == "cl"
    assert job.name == "beat" and job.state == "waiting"
    assert int(q.redis.hget(q.keys.cronlast, "k")) == dues[1]
    # the occurrence's job finished and its hash went (no retention): still not again
    q.redis.delete(q.keys.job(cron.job_id("k", dues[1])))
    assert scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), [*fire, dues[1]])[0] == 0
    assert not q.redis.exists(q.keys.job(cron.job_id("k", dues[1])))
    # a fire computed from an older rev (the cron was replaced) admits nothing
    q.add_cron("k", "* * * * * *", "beat")
    reply = scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), [*fire, dues[1] + 1000])
    assert int(reply[0]) == -1
    q.remove_cron("k")
    assert int(scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), [*fire, 10**13])[0]) == -1


def test_a_fired_job_is_written_as_admit_writes_one(redis_url: str, queue_name: str,
                                                    r: redis.Redis) -> None:
    """cron_fire.lua repeats admit.lua's job write: the two must not drift apart."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("beat", {"n": 1}, lane="cl", job_id="plain")
    q.add_cron("k", "* * * * * *", "beat", {"n": 1}, lane="cl")
    spec = cron.CronSpec.decode("k", r.hget(q.keys.crons, "k"))
    due = int(r.hget(q.keys.cronlast, "k")) + 1000
    scripts.CRON_FIRE(r, cron.fire_keys(q.keys), [q.keys.prefix, "k", spec.rev, due])
    plain = r.hgetall(q.keys.job("plain"))
    fired = r.hgetall(q.keys.job(cron.job_id("k", due)))
    assert set(fired) == set(plain)
    differ = {k for k in plain if plain[k] != fired[k]}
    assert differ <= {b"id", b"created_ms"}, differ
    assert r.lrange(q.keys.lane("cl"), 0, -1) == [b"plain", cron.job_id("k", due).encode()]
    assert r.lrange(q.keys.ring, 0, -1) == [b"cl"]
    assert q.counts()["waiting"] == 2 and int(r.hget(q.keys.stats, "waiting")) == 2


def test_asyncio_twins(redis_url: str, queue_name: str) -> None:
    async def run() -> tuple[list[echomq.Cron], bool, list[echomq.Cron]]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            with pytest.raises(InvalidSchedule):
                await aq.add_cron("k", "not cron", "x")
            await aq.add_cron("k", "*/5 * * * * *", "x", [1, 2])
            listed = await aq.crons()
            removed = await aq.remove_cron("k")
            return listed, removed, await aq.crons()
        finally:
            await aq.close()

    listed, removed, after = asyncio.run(run())
    assert [(c.key, c.expr, c.payload) for c in listed] == [("k", "*/5 * * * * *", [1, 2])]
    assert removed is True and after == []
    # the sync queue reads what the asyncio one wrote, and the other way round
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_cron("s", "@hourly", "y")
    assert json.loads(q.redis.hget(q.keys.crons, "s"))["expr"] == "@hourly"


def _server_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def test_re_adding_a_cron_unchanged_keeps_the_occurrences_due_meanwhile(
        redis_url: str, queue_name: str) -> None:
    """An application that registers its crons at every start (add_cron with the same key
    and schedule) while no scheduler has admitted the latest occurrence yet (a hand-over,
    a deploy) must not lose that occurrence; a changed schedule starts from now."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    first = q.add_cron("k", "* * * * * *", "beat")
    assert first.last_ms is not None
    deadline = _server_ms(q.redis) + 10_000
    while _server_ms(q.redis) < first.last_ms + 1500:  # an occurrence is due, unadmitted
        assert _server_ms(q.redis) < deadline
        q.redis.blpop([f"{q.keys.prefix}never"], timeout=0.05)  # parks, as a timed wait
    again = q.add_cron("k", "* * * * * *", "beat", {"v": 2})  # same schedule, new payload
    assert again.last_ms == first.last_ms  # the leader still admits what fell due
    assert q.crons()[0].payload == {"v": 2}
    changed = q.add_cron("k", "*/2 * * * * *", "beat")
    assert changed.last_ms is not None and changed.last_ms >= first.last_ms + 1500


def test_a_daily_cron_in_the_repeated_hour_runs_once_on_the_fall_back_day() -> None:
    day = _ms(2026, 10, 24, 12, 0, 0)  # noon UTC the day before; Paris falls back at 03:00
    dues = list(cron.due_between("30 2 * * *", "Europe/Paris", day, day + 86_400_000))
    assert len(dues) == 1
    assert dues == [_ms(2026, 10, 25, 0, 30, 0)]  # 02:30 CEST, the first of the two
    # the next occurrence after it is the next day's, not the repeated 02:30 CET
    assert cron.next_after("30 2 * * *", "Europe/Paris", dues[0]) == _ms(2026, 10, 26, 1, 30, 0)
    # an hourly expression runs by the clock: once an hour, both 02:30s of the day
    hourly = list(cron.due_between("30 * * * *", "Europe/Paris", day, day + 86_400_000))
    assert len(hourly) == 24
    assert _ms(2026, 10, 25, 0, 30, 0) in hourly and _ms(2026, 10, 25, 1, 30, 0) in hourly
