"""The prefetch buffer under the supervisor: jobs claimed beyond the concurrency, not started.

With ``--concurrency 20`` a child holds up to 30 jobs once it has seen jobs finish fast
(the buffer holds what the slots finish in about 25 ms): 20 running and 10 buffered. A
buffered job never ran, so handing it back (a drain, a recycle, a dead child) charges it
nothing, and it runs exactly once afterwards.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable

import psutil
import redis

import echomq
from echomq import scripts

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


def _started(r: redis.Redis, queue: str) -> list[tuple[str, int, int]]:
    out = []
    for raw in r.lrange(f"ledger:{queue}:started", 0, -1):
        job_id, pid, attempts = raw.decode().rsplit(":", 2)
        out.append((job_id, int(pid), int(attempts)))
    return out


def _fill_running_and_buffer(supervisor: Start, redis_url: str, queue_name: str,
                             r: redis.Redis, *args: str) -> tuple[Supervisor, list[str],
                                                                   set[str]]:
    """30 gated jobs in one child at concurrency 20: (supervisor, ids, the 20 running)."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "20",
                     "--handler", "sup_jobs:record_async", *args).started(1)
    q.add_many([("x", {}) for _ in range(60)])  # fast jobs: the buffer grows to 10
    wait_until(lambda: q.counts()["completed"] == 60, 10, "the fast jobs")
    r.delete(f"ledger:{queue_name}:started", f"ledger:{queue_name}:done")
    ids = q.add_many([("x", {"gate": True}) for _ in range(30)])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 20, 10, "20 running jobs")
    wait_until(lambda: q.counts()["active"] == 30, 10, "10 more jobs in the buffer")
    assert r.llen(f"ledger:{queue_name}:started") == 20  # the buffered ones have not started
    running = {job_id for job_id, _, _ in _started(r, queue_name)}
    return sup, ids, running


def test_a_sigterm_drain_hands_buffered_jobs_back_unstarted_and_they_run_once(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup, ids, running = _fill_running_and_buffer(supervisor, redis_url, queue_name, r,
                                                 "--drain-timeout", "20")
    sup.signal(signal.SIGTERM)
    # the child took the STOP once its buffer is back: a gate opened before that ends a
    # running job whose slot starts a buffered one, which takes another job's gate
    wait_until(lambda: q.counts()["waiting"] == 10, 10, "the buffer handed back")
    assert r.llen(f"ledger:{queue_name}:started") == 20
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 20))
    assert sup.wait(20) == 0
    assert q.counts() == {"waiting": 10, "scheduled": 0, "active": 0, "completed": 80,
                          "dead": 0, "cancelled": 0, "blocked": 0}
    for job_id in set(ids) - running:  # handed back uncharged: no attempt, no stall
        job = q.get(job_id)
        assert job is not None and (job.state, job.attempts, job.stalls) == ("waiting", 0, 0)
    supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "20",
               "--handler", "sup_jobs:record_async").started(1)
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 10))
    wait_until(lambda: q.counts()["completed"] == 90, 20, "every job to complete")
    assert Counter(job_id for job_id, _, _ in _started(r, queue_name)) == {j: 1 for j in ids}
    assert all(q.get(j).attempts == 1 for j in ids)  # type: ignore[union-attr]


def test_a_killed_child_hands_buffered_jobs_back_uncharged_and_they_run_once(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup, ids, running = _fill_running_and_buffer(supervisor, redis_url, queue_name, r)
    [pid] = {p for _, p, _ in _started(r, queue_name)}
    psutil.Process(pid).kill()
    sup.wait_for_log(r"requeued 10, buried 0 \(mode unstarted\)")
    # 20 ran at once: which one killed the process is not known, so none is charged and
    # each runs alone next time (suspects)
    sup.wait_for_log(r"requeued 20, buried 0 \(mode suspect\)")
    sup.wait_for_log(rf"consumer {pid} killed by SIGKILL, released 30 job")
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 30))
    wait_until(lambda: q.counts()["completed"] == 90, 20, "every job to complete")
    runs = Counter(job_id for job_id, _, _ in _started(r, queue_name))
    assert runs == {j: 2 if j in running else 1 for j in ids}
    for job_id in ids:  # nothing was charged: a suspect's crashed run is not counted either
        job = q.get(job_id)
        assert job is not None
        assert (job.attempts, job.stalls) == (1, 0), job


def test_a_recycle_with_a_full_buffer_loses_nothing_and_runs_each_job_once(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "8",
               "--max-jobs", "10", "--handler", "sup_jobs:record_async").started(1)
    ids = q.add_many([("x", {"sleep": 0.01}) for _ in range(100)])
    wait_until(lambda: q.counts()["completed"] == 100, 30, "every job to complete")
    runs = Counter(job_id for job_id, _, _ in _started(r, queue_name))
    assert runs == {j: 1 for j in ids}
    assert {(q.get(j).attempts, q.get(j).stalls) for j in ids} == {(1, 0)}  # type: ignore[union-attr]


def test_jobs_that_run_long_are_not_buffered_but_left_for_other_consumers(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "4",
               "--handler", "sup_jobs:record_async").started(1)
    q.add_many([("x", {"sleep": 0.3}) for _ in range(4)])  # 4 slots finish one in 75 ms
    wait_until(lambda: q.counts()["completed"] == 4, 10, "the slow jobs")
    r.delete(f"ledger:{queue_name}:started")
    q.add_many([("x", {"gate": True}) for _ in range(6)])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 4, 10, "4 running jobs")
    assert q.counts()["active"] == 4 and q.counts()["waiting"] == 2
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 6))
    wait_until(lambda: q.counts()["completed"] == 10, 10, "every job to complete")


def test_a_buffered_job_whose_lease_was_reaped_is_not_started_by_its_old_holder(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # nothing extends the leases while the supervisor is stopped: the buffered job's lease
    # runs out and a reap hands it to the lane again; the child must not run it when a slot
    # frees up, since the job now belongs to whoever claims it next
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "2",
                     "--lease-ms", "1000", "--handler", "sup_jobs:record_async").started(1)
    q.add_many([("x", {}) for _ in range(20)])  # fast jobs: the buffer grows to 1
    wait_until(lambda: q.counts()["completed"] == 20, 10, "the fast jobs")
    r.delete(f"ledger:{queue_name}:started", f"ledger:{queue_name}:done")
    *gated, buffered = q.add_many([("x", {"gate": True}), ("x", {"gate": True}), ("x", {})])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 2, 10, "2 running jobs")
    wait_until(lambda: q.counts()["active"] == 3, 10, "one more job in the buffer")
    sup.signal(signal.SIGSTOP)  # no lease is extended from now on
    try:
        def expired() -> bool:
            seconds, micros = r.time()
            score = r.zscore(q.keys.leases, buffered)
            return score is not None and score <= seconds * 1000 + micros // 1000
        wait_until(expired, 10, "the buffered job's lease to run out")
        assert scripts.reap(r, q.keys)[0] == 3  # a reap (another supervisor's) takes all 3
        r.rpush(f"ledger:{queue_name}:gate", 1)  # a slot frees up in the child
        # at least one: with its parent stopped the child still claims, so the reaped jobs
        # may be claimed again at once and the non-gated one run to its end as well
        wait_until(lambda: r.llen(f"ledger:{queue_name}:done") >= 1, 10, "a gated job's end")
    finally:
        sup.signal(signal.SIGCONT)
    r.rpush(f"ledger:{queue_name}:gate", *([1] * 3))
    wait_until(lambda: q.counts()["completed"] == 23, 20, "every job to complete")
    runs = Counter(job_id for job_id, _, _ in _started(r, queue_name))
    assert runs[buffered] == 1, runs  # once, by whoever claimed it after the reap
    assert all(runs[j] in (1, 2) for j in gated)  # a running job may run again: at least once
