"""Concurrency per consumer process, async handlers and time limits, under the supervisor."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable

import psutil
import pytest
import redis

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]
# the tests of killing and stopping a concurrent consumer run on both event loops
LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])


def _started(r: redis.Redis, queue: str) -> list[tuple[str, int, int]]:
    out = []
    for raw in r.lrange(f"ledger:{queue}:started", 0, -1):
        job_id, pid, attempts = raw.decode().rsplit(":", 2)
        out.append((job_id, int(pid), int(attempts)))
    return out


def _children(sup: Supervisor) -> list[int]:
    return [c.pid for c in psutil.Process(sup.proc.pid).children()]


def test_200_async_jobs_of_200_ms_finish_in_under_2_s_in_one_process(
        supervisor: Start, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "50",
               "--handler", "sup_jobs:record_async").started(1)
    wait_until(lambda: q.counts()["waiting"] == 0, 10, "the consumer to be ready")
    t0 = time.monotonic()
    q.add_many([("x", {"sleep": 0.2}) for _ in range(200)])
    wait_until(lambda: q.counts()["completed"] == 200, 10, "200 completions")
    assert time.monotonic() - t0 < 2.0  # 4 waves of 50: 0.8 s of waiting


def test_200_sync_jobs_of_200_ms_finish_in_under_2_s_in_one_process_of_threads(
        supervisor: Start, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "50").started(1)
    wait_until(lambda: q.counts()["waiting"] == 0, 10, "the consumer to be ready")
    t0 = time.monotonic()
    q.add_many([("x", {"sleep": 0.2}) for _ in range(200)])
    wait_until(lambda: q.counts()["completed"] == 200, 10, "200 completions")
    assert time.monotonic() - t0 < 2.0


@LOOPS
def test_sigkill_a_child_running_20_jobs_returns_exactly_those_uncharged_to_run_alone(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis, loop: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "20",
                     "--handler", "sup_jobs:record_async",
                     env={"ECHOMQ_EVENT_LOOP": loop}).started(1)
    ids = q.add_many([("x", {"gate": True}) for _ in range(30)])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 20, 10, "20 running jobs")
    running = {job_id for job_id, _, _ in _started(r, queue_name)}
    [pid] = {p for _, p, _ in _started(r, queue_name)}
    psutil.Process(pid).kill()
    sup.wait_for_log(rf"consumer {pid} killed by SIGKILL, released 20 job")
    # which of the 20 killed it is not known: none is charged, each runs alone next time
    for job_id in ids:
        job = q.get(job_id)
        assert job is not None
        assert job.stalls == 0, job
        assert r.hget(f"emq:{{{queue_name}}}:job:{job_id}", "alone") == (
            b"1" if job_id in running else None)
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 60))
    wait_until(lambda: q.counts()["completed"] == 30, 30, "every job to complete")
    runs = Counter(job_id for job_id, _, _ in _started(r, queue_name))
    assert {job_id for job_id, n in runs.items() if n == 2} == running
    assert all(q.get(j).stalls == 0 for j in ids)  # type: ignore[union-attr]


@LOOPS
def test_sigterm_with_50_in_flight_finishes_them_and_exits_zero(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis, loop: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "50",
                     "--handler", "sup_jobs:record_async", "--drain-timeout", "20",
                     env={"ECHOMQ_EVENT_LOOP": loop}).started(1)
    q.add_many([("x", {"gate": True}) for _ in range(60)])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 50, 10, "50 running jobs")
    sup.signal(signal.SIGTERM)
    sup.wait_for_log(r"draining")
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 50))
    assert sup.wait(20) == 0
    assert q.counts() == {"waiting": 10, "scheduled": 0, "active": 0, "completed": 50,
                          "dead": 0, "cancelled": 0, "blocked": 0}


def test_sigterm_past_the_drain_timeout_requeues_the_50_in_flight(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "50",
                     "--handler", "sup_jobs:record_async", "--drain-timeout", "0.5").started(1)
    ids = q.add_many([("x", {"gate": True}) for _ in range(50)])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 50, 10, "50 running jobs")
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == 0
    jobs = [q.get(j) for j in ids]
    assert {(j.state, j.stalls) for j in jobs if j is not None} == {("waiting", 1)}


def test_a_sync_job_past_its_limit_ends_its_process_and_fails_timed_out(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "4").started(1)
    wait_until(lambda: len(_children(sup)) == 1, 10, "the consumer")
    [first] = _children(sup)
    hung = q.add("x", {"sleep": 60}, timeout=1.0, max_attempts=2, backoff=0)
    others = q.add_many([("x", {"sleep": 2}) for _ in range(3)])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 4, 10, "four running jobs")
    sup.wait_for_log(rf"consumer {first} ran job {hung} past its limit of 1s")
    wait_until(lambda: len(_children(sup)) == 1 and first not in _children(sup), 10,
               "a new consumer in the slot")
    wait_until(lambda: q.get(hung).state == "dead", 20, "the hung job's two attempts")  # type: ignore[union-attr]
    job = q.get(hung)
    assert job is not None and job.attempts == 2 and "timed out after 1 s" in (job.error or "")
    wait_until(lambda: q.counts()["completed"] == 3, 20, "the other jobs")
    for job_id in others:
        other = q.get(job_id)
        assert other is not None and other.stalls == 0 and other.attempts == 1, other
    assert "respawn in" not in sup.log  # not a crash: no backoff


def test_an_async_job_that_blocks_its_loop_past_its_limit_ends_its_process(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "2",
                     "--handler", "sup_jobs:record_async").started(1)
    job_id = q.add("x", {"block": 60}, timeout=0.5, max_attempts=1)
    # the loop cannot cancel it; the supervisor ends the process a grace period later
    sup.wait_for_log(rf"ran job {job_id} past its limit of 0.5s", timeout=20)
    wait_until(lambda: q.get(job_id).state == "dead", 10, "the job to fail")  # type: ignore[union-attr]
    assert "timed out after 0.5 s" in (q.get(job_id).error or "")  # type: ignore[union-attr]
    ok = q.add("x", {})
    wait_until(lambda: q.get(ok).state == "completed", 10, "the next job")  # type: ignore[union-attr]


def test_idle_concurrent_consumers_cost_one_blocking_call_per_beat(
        supervisor: Start, queue_name: str) -> None:
    import threading

    from echomq.supervisor.drills.localredis import LocalRedis

    server = LocalRedis().start()
    try:
        r = redis.Redis.from_url(server.url)
        q = echomq.Queue(queue_name, redis=r)
        supervisor(server.url, queue_name, "--processes", "4", "--concurrency", "50",
                   "--handler", "sup_jobs:record_async",
                   env={"ECHOMQ_TEST_LEDGER_URL": server.url}).started(4)
        # each consumer has run a job (so its loop and clients exist), then went idle
        q.add_many([("x", {}) for _ in range(40)])
        wait_until(lambda: q.counts()["completed"] == 40, 15, "the warm-up jobs")
        wait_until(lambda: int(r.info("clients")["blocked_clients"]) == 1, 10, "the metronome")
        threading.Event().wait(0.5)  # let the last claims and rings settle before counting
        r.config_resetstat()
        t0 = time.monotonic()
        threading.Event().wait(4.0)  # idle time passing is the measurement
        elapsed = time.monotonic() - t0
        calls = {k: v["calls"] for k, v in r.info("commandstats").items()}
        calls.pop("cmdstat_config", None)
        calls.pop("cmdstat_info", None)
        assert calls.get("cmdstat_blpop", 0) <= elapsed + 1, calls
        assert sum(calls.values()) <= elapsed + 1 + 8, calls
        r.close()
    finally:
        server.stop()


def test_a_sync_job_past_the_default_limit_ends_its_one_job_process(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1",
                     "--job-timeout", "0.5").started(1)
    hung = q.add("x", {"sleep": 60}, max_attempts=1)
    sup.wait_for_log(rf"ran job {hung} past its limit of 0.5s")
    wait_until(lambda: q.get(hung).state == "dead", 10, "the hung job to fail")  # type: ignore[union-attr]
    assert "timed out after 0.5 s" in (q.get(hung).error or "")  # type: ignore[union-attr]
    ok = q.add("x", {})
    wait_until(lambda: q.get(ok).state == "completed", 10, "the next job")  # type: ignore[union-attr]
    assert "respawn in" not in sup.log


def test_forked_consumers_run_async_jobs_on_uvloop_when_asked(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """Each forked child makes its own loop after the fork, of the kind ECHOMQ_EVENT_LOOP
    names; jobs run on it in every child."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "2", "--concurrency", "10",
               "--handler", "sup_jobs:record_loop",
               env={"ECHOMQ_TEST_LEDGER_URL": redis_url, "ECHOMQ_EVENT_LOOP": "uvloop"}
               ).started(2)
    ids = q.add_many([("x", {}) for _ in range(100)])
    wait_until(lambda: q.counts()["completed"] == 100, 15, "100 completions")
    ran_on = r.lrange(f"ledger:{queue_name}:loops", 0, -1)
    loops_seen = Counter(x.decode().split(".")[0] for x in ran_on)
    assert loops_seen == {"uvloop": 100}
    assert {q.result(i, timeout=5).split(".")[0] for i in ids} == {"uvloop"}
