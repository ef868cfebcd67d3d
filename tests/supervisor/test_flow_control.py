"""Flow control under a real supervisor: strict lane order, lane limits, rate limits and
priorities, from a ledger the handler writes to the server (tests/supervisor/sup_flow.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]
HANDLER = ("--handler", "sup_flow:ledger")


@dataclass
class Run:
    lane: str
    seq: int
    job_id: str
    start: float
    end: float | None
    active: int  # the lane's executions running at this start, this one included
    started_ms: int  # the claim's server time


def _runs(r: redis.Redis, queue: str) -> list[Run]:
    """Every execution in start order, with its end when it ended."""
    runs: list[Run] = []
    open_runs: dict[str, Run] = {}
    for raw in r.lrange(f"ledger:{queue}:flow", 0, -1):
        words = raw.decode().split()
        if words[0] == "start":
            run = Run(words[1], int(words[2]), words[3], float(words[4]), None, int(words[5]),
                      int(words[6]))
            runs.append(run)
            open_runs[run.job_id] = run
        else:
            open_runs.pop(words[3]).end = float(words[4])
    return runs


def test_max_active_1_runs_each_lane_in_admit_order_one_at_a_time(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    # 1,000 jobs over 10 lanes, admitted interleaved; each lane's seq is its admit order
    q.add_many([("x", {"seq": i // 10}, {"lane": f"lane-{i % 10}"}) for i in range(1000)])
    supervisor(redis_url, queue_name, *HANDLER, "--processes", "4", "--concurrency", "4",
               "--lane-limit", "1").started(4)
    wait_until(lambda: q.counts()["completed"] == 1000, 120, "1000 completions")
    by_lane: dict[str, list[Run]] = defaultdict(list)
    for run in _runs(r, queue_name):
        by_lane[run.lane].append(run)
    assert sorted(by_lane) == [f"lane-{i}" for i in range(10)]
    for lane, runs in by_lane.items():
        assert [run.seq for run in runs] == list(range(100)), lane  # start order = admit order
        assert {run.active for run in runs} == {1}, lane
        for before, after in zip(runs, runs[1:], strict=False):
            assert before.end is not None and before.end <= after.start, (lane, before, after)


def test_a_lane_limit_of_3_is_never_exceeded_by_16_slots(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    for lane in ("a", "b", "c"):
        q.set_lane_limit(lane, max_active=3)
    q.add_many([("x", {"sleep": 0.02}, {"lane": lane}) for lane in ("a", "b", "c")
                for _ in range(60)])
    supervisor(redis_url, queue_name, *HANDLER, "--processes", "4",
               "--concurrency", "4").started(4)
    wait_until(lambda: q.counts()["completed"] == 180, 120, "180 completions")
    runs = _runs(r, queue_name)
    assert len(runs) == 180
    most = {lane: max(run.active for run in runs if run.lane == lane) for lane in "abc"}
    assert most == {"a": 3, "b": 3, "c": 3}  # reached, never passed


@pytest.mark.parametrize("doorbell", ["list", "marker"])
def test_a_rate_of_10_per_second_starts_30_in_3_s_while_other_lanes_run_freely(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis,
        doorbell: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("slow", rate=10, per_s=1.0)
    q.add_many([("x", {"seq": i}, {"lane": "slow"}) for i in range(100)])
    q.add_many([("x", {"seq": i // 4}, {"lane": f"free-{i % 4}"}) for i in range(400)])
    supervisor(redis_url, queue_name, *HANDLER, "--processes", "4",
               "--doorbell", doorbell).started(4)

    def slow_starts() -> list[int]:
        return sorted(run.started_ms for run in _runs(r, queue_name) if run.lane == "slow")

    # until a start falls past the first 3 s of the slow lane (server clock)
    wait_until(lambda: (s := slow_starts()) != [] and s[-1] >= s[0] + 3000, 30,
               "the slow lane's fourth second")
    starts = slow_starts()
    within = [s for s in starts if s < starts[0] + 3000]
    assert 29 <= len(within) <= 31, len(within)
    # any 1 s window holds at most 10 starts
    assert all(sum(1 for t in starts if s <= t < s + 1000) <= 10 for s in starts)
    # the other lanes were not held to the slow lane's pace (400 jobs at 10/s take 40 s)
    free = [run for run in _runs(r, queue_name) if run.lane != "slow"]
    assert len(free) == 400
    assert max(run.started_ms for run in free) < starts[0] + 3000


def test_priority_9_jobs_admitted_behind_10000_start_next(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, *HANDLER, "--processes", "1").started(1)
    q.pause()  # the backlog and the urgent jobs are all there before anything is claimed
    q.add_many([("x", {"seq": i}, {"lane": f"bulk-{i % 10}"}) for i in range(10_000)])
    urgent = q.add_many([("x", {"seq": i}, {"lane": f"bulk-{i}", "priority": 9})
                         for i in range(5)])
    q.resume()
    wait_until(lambda: r.llen(f"ledger:{queue_name}:flow") >= 40, 30, "20 starts")
    first = [run.job_id for run in _runs(r, queue_name)[:20]]
    assert first[:5] == urgent
    assert q.counts()["waiting"] > 9_000


def test_with_max_active_1_a_retry_lets_the_next_job_start_and_rejoins_the_tail(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_lane_limit("a", max_active=1)
    first = q.add("x", {"seq": 0, "fail_first": True}, lane="a", backoff=1.0)
    q.add_many([("x", {"seq": i}, {"lane": "a"}) for i in range(1, 5)])
    supervisor(redis_url, queue_name, *HANDLER, "--processes", "2",
               "--concurrency", "2").started(2)
    wait_until(lambda: q.counts()["completed"] == 5, 30, "5 completions")
    runs = _runs(r, queue_name)
    assert [run.seq for run in runs] == [0, 1, 2, 3, 4, 0]  # the retry went to the tail
    assert runs[-1].job_id == first and {run.active for run in runs} == {1}
    for before, after in zip(runs, runs[1:], strict=False):
        assert before.end is not None and before.end <= after.start
