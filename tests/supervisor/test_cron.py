"""Crons under real supervisors: every occurrence admitted once through a SIGKILL of the
leader, one admitted for a stretch when no scheduler ran, and crons kept through Valkey
restarting empty when there is a floor."""

from __future__ import annotations

import math
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis

import echomq

from .conftest import CLI, ROOT, Supervisor, wait_until

Start = Callable[..., Supervisor]
SECOND = 1000


def _server_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def _dues(q: echomq.Queue, key: str) -> list[int]:
    """Due times of every occurrence admitted so far (job ids ``cron:<key>:<due>``)."""
    prefix = f"{q.keys.prefix}job:cron:{key}:".encode()
    return sorted(int(k[len(prefix):]) for k in q.redis.scan_iter(match=prefix + b"*",
                                                                   count=1000))


def _first_runs(r: redis.Redis, queue: str) -> Counter[str]:
    """Runs per job id at attempt 1: a second admission of an occurrence would show as a
    second first attempt (a rerun after a crash is attempt 2)."""
    runs: Counter[str] = Counter()
    for entry in r.lrange(f"ledger:{queue}:started", 0, -1):
        job_id, _pid, attempts = entry.decode().rsplit(":", 2)
        if attempts == "1":
            runs[job_id] += 1
    return runs


def _leader_pid(r: redis.Redis, q: echomq.Queue) -> int | None:
    held = r.get(q.keys.leader)
    if held is None:
        return None
    return int(held.decode().split("|")[0].split(":")[1])  # "<host>:<pid>:<hex>|<fence>"


def _floor_args(kind: str, tmp_path: Path) -> list[str]:
    if kind == "none":
        return []
    url = f"sqlite:///{tmp_path}/floor.db"
    subprocess.run([*CLI, "migrate", "--floor-url", url], check=True, cwd=ROOT,
                   capture_output=True)
    return ["--floor-url", url]


@pytest.mark.parametrize("floor", ["none", "sqlite"])
def test_every_second_through_a_leader_kill_each_occurrence_once(
        supervisor: Start, private_redis: LocalRedis, queue_name: str, tmp_path: Path,
        floor: str) -> None:
    url = private_redis.url
    r = redis.Redis.from_url(url)
    q = echomq.Queue(queue_name, redis=r)
    flags = ["--processes", "1", "--beat-ms", "100", *_floor_args(floor, tmp_path)]
    sups = [supervisor(url, queue_name, *flags).started(1) for _ in range(2)]
    q.add_cron("tick", "* * * * * *", "beat", {})
    wait_until(lambda: len(_dues(q, "tick")) >= 2, 15, "two occurrences")
    pid = _leader_pid(r, q)
    (leader,) = [s for s in sups if s.proc.pid == pid]
    (survivor,) = [s for s in sups if s is not leader]
    killed_at = _server_ms(r)
    leader.signal(signal.SIGKILL)
    leader.wait()
    # 5 s of occurrences after the kill, the new leader's take-over (a lease) among them
    wait_until(lambda: _leader_pid(r, q) == survivor.proc.pid, 15, "the survivor's lead")
    wait_until(lambda: max(_dues(q, "tick")) >= killed_at + 5 * SECOND, 20, "5 s more")
    dues = _dues(q, "tick")
    assert dues[0] < killed_at < dues[-1]
    assert dues == list(range(dues[0], dues[-1] + 1, SECOND)), "an occurrence was skipped"
    wait_until(lambda: q.counts()["waiting"] == 0 and q.counts()["active"] == 0, 20,
               "every occurrence run")
    runs = _first_runs(r, queue_name)
    ids = {f"cron:tick:{due}" for due in dues}
    assert ids <= set(runs), ids - set(runs)
    assert {job_id: n for job_id, n in runs.items() if n != 1} == {}, "admitted twice"
    assert "Traceback" not in survivor.log


def test_occurrences_missed_while_no_scheduler_ran_are_admitted_once(
        supervisor: Start, private_redis: LocalRedis, queue_name: str) -> None:
    url = private_redis.url
    r = redis.Redis.from_url(url)
    q = echomq.Queue(queue_name, redis=r)
    flags = ["--processes", "1", "--beat-ms", "100"]
    first = supervisor(url, queue_name, *flags).started(1)
    q.add_cron("tick", "* * * * * *", "beat", {})
    wait_until(lambda: len(_dues(q, "tick")) >= 2, 15, "two occurrences")
    first.stop()
    stopped_at = _server_ms(r)
    before = _dues(q, "tick")
    # no scheduler for 9 s: longer than any leader hand-over (2 leases and some beats)
    wait_until(lambda: _server_ms(r) > stopped_at + 9 * SECOND, 20, "9 s without a scheduler")
    second = supervisor(url, queue_name, *flags).started(1)
    try:
        wait_until(lambda: len(_dues(q, "tick")) >= len(before) + 3, 15, "occurrences again")
    except AssertionError as exc:  # say what the scheduler did meanwhile
        raise AssertionError(f"{exc}; leader {r.get(q.keys.leader)!r}, meta "
                             f"{r.hgetall(q.keys.meta)!r}, server ms {_server_ms(r)}, "
                             f"dues {_dues(q, 'tick')[-5:]}; supervisor log:\n"
                             f"{second.log}") from None
    after = [d for d in _dues(q, "tick") if d > before[-1]]
    # the first admitted on return is the latest one missed; the 8+ before it are not
    assert after[0] >= stopped_at + 8 * SECOND, (before[-1], after)
    assert after == list(range(after[0], after[-1] + 1, SECOND))
    wait_until(lambda: q.counts()["waiting"] == 0 and q.counts()["active"] == 0, 20,
               "every occurrence run")
    runs = _first_runs(r, queue_name)
    assert {f"cron:tick:{d}" for d in before + after} <= set(runs)
    assert set(runs.values()) == {1}


def test_crons_survive_valkey_restarting_empty_with_a_floor(
        supervisor: Start, private_redis: LocalRedis, queue_name: str,
        tmp_path: Path) -> None:
    url = private_redis.url
    flags = ["--processes", "1", "--beat-ms", "100", *_floor_args("sqlite", tmp_path)]
    supervisor(url, queue_name, *flags).started(1)
    q = echomq.Queue(queue_name, redis_url=url)
    q.add_cron("tick", "* * * * * *", "beat", {"n": 1})
    q.add_cron("nightly", "0 3 * * *", "report")
    wait_until(lambda: len(_dues(q, "tick")) >= 2, 15, "two occurrences")
    private_redis.restart_empty()
    q2 = echomq.Queue(queue_name, redis_url=url)
    wait_until(lambda: {c.key for c in q2.crons()} == {"tick", "nightly"}, 20,
               "the crons back from the floor")
    wait_until(lambda: len(_dues(q2, "tick")) >= 2, 15, "occurrences after the restart")
    (tick,) = [c for c in q2.crons() if c.key == "tick"]
    assert (tick.expr, tick.name, tick.payload) == ("* * * * * *", "beat", {"n": 1})


def test_the_scheduler_waits_for_the_next_occurrence_not_for_its_beat(
        private_redis: LocalRedis, queue_name: str) -> None:
    """A 10 s beat, a cron every second: the thread's timed wait ends at each due time."""
    from echomq.supervisor.scheduler import Scheduler, SchedulerThread

    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis=r)
    q.add_cron("tick", "* * * * * *", "beat", {})
    sched = Scheduler(queue_name, r, None, beat_ms=10_000, horizon_s=3600)  # crons alone
    thread = SchedulerThread(sched)
    try:
        wait_until(lambda: len(_dues(q, "tick")) >= 3, 8, "three occurrences in one beat")
        assert sched.deadline() <= sched.next_tick
        assert r.hget(q.keys.meta, "fold") is None  # no floor: the fold lease is left alone
        assert q.remove_cron("tick") is True
        # the next wake-up reads the crons again: none left, so it waits for its beat
        wait_until(lambda: not sched.crontab.specs and sched.next_cron == math.inf, 5,
                   "the removal seen")
        dues = _dues(q, "tick")
        assert dues == list(range(dues[0], dues[-1] + 1, SECOND))
    finally:
        thread.close()
    assert _dues(q, "tick") == dues  # nothing admitted after the removal was seen
