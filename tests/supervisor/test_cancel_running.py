"""Cancel of a running job under the real supervisor: a sync handler's process is ended and
respawned (its other jobs handed back uncharged), an async handler's task is cancelled."""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil
import redis

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


def _started(r: redis.Redis, queue: str) -> list[tuple[str, int, int]]:
    out = []
    for raw in r.lrange(f"ledger:{queue}:started", 0, -1):
        job_id, pid, attempts = raw.decode().rsplit(":", 2)
        out.append((job_id, int(pid), int(attempts)))
    return out


def _children(sup: Supervisor) -> list[int]:
    return [c.pid for c in psutil.Process(sup.proc.pid).children()]


def _done(r: redis.Redis, queue: str) -> list[str]:
    return [d.decode() for d in r.lrange(f"ledger:{queue}:done", 0, -1)]


def test_cancel_of_a_running_sync_job_ends_its_process_and_respawns_it(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    jid = q.add("x", {"gate": True}, max_attempts=3)  # blocks in BLPOP for up to 30 s
    wait_until(lambda: len(_started(r, queue_name)) == 1, 10, "the job to start")
    pid = _started(r, queue_name)[0][1]
    assert q.cancel(jid) is True
    sup.wait_for_log(rf"job {jid} cancelled while consumer {pid} ran it", timeout=10)
    sup.wait_for_log(r"consumer \d+ started", count=2, timeout=10)
    wait_until(lambda: pid not in _children(sup), 10, "the blocked process to be gone")
    job = q.get(jid)
    assert job is not None and job.state == "cancelled"
    assert job.error == "cancelled while running"
    after = q.add("x", {})
    wait_until(lambda: after in _done(r, queue_name), 10, "the respawned consumer to run a job")
    assert jid not in _done(r, queue_name)
    assert [s for s in _started(r, queue_name) if s[0] == jid] == [(jid, pid, 1)]  # not retried
    assert q.get(jid).state == "cancelled"  # type: ignore[union-attr]


def test_cancel_under_threads_hands_the_process_other_jobs_back_uncharged(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "2").started(1)
    ids = [q.add("x", {"gate": True}, max_attempts=1) for _ in range(2)]
    wait_until(lambda: len(_started(r, queue_name)) == 2, 10, "both jobs to start")
    pid = _started(r, queue_name)[0][1]
    assert q.cancel(ids[0]) is True
    sup.wait_for_log(rf"job {ids[0]} cancelled while consumer {pid} ran it", timeout=10)
    # the other one runs again in the new process, uncharged: still its first attempt (a
    # stall would be charged otherwise: its one attempt spent, it would be dead)
    wait_until(lambda: len(_started(r, queue_name)) == 3, 15, "the other to run again")
    again = _started(r, queue_name)[2]
    assert again[0] == ids[1] and again[1] != pid and again[2] == 1
    # handed back as never started: not a suspect of the process's end (which would make
    # it run alone), and not charged a stall
    sup.wait_for_log(r"requeued 1, buried 0 \(mode unstarted\)")
    assert "(mode suspect)" not in sup.log and "(mode stall)" not in sup.log
    r.rpush(f"ledger:{queue_name}:gate", "go")
    wait_until(lambda: q.get(ids[1]).state == "completed",  # type: ignore[union-attr]
               10, "the other to finish")
    assert _done(r, queue_name) == [ids[1]]
    job = q.get(ids[1])
    assert job is not None and job.attempts == 1 and job.stalls == 0
    assert q.get(ids[0]).error == "cancelled while running"  # type: ignore[union-attr]
    assert pid not in _children(sup)


def test_cancel_of_a_running_async_job_cancels_its_task_not_its_process(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1",
                     "--handler", "sup_jobs:record_async").started(1)
    jid = q.add("x", {"gate": True}, max_attempts=3)
    wait_until(lambda: len(_started(r, queue_name)) == 1, 10, "the job to start")
    pid = _started(r, queue_name)[0][1]
    assert q.cancel(jid) is True
    # its one slot frees at once: the task was cancelled, not left waiting on its gate
    after = q.add("x", {})
    wait_until(lambda: after in _done(r, queue_name), 10, "the next job to run")
    assert _started(r, queue_name)[-1][1] == pid  # the same process ran it
    assert _children(sup) == [pid]
    assert "ending the process" not in sup.log
    job = q.get(jid)
    assert job is not None and job.state == "cancelled" and job.error == "cancelled while running"
    assert jid not in _done(r, queue_name)
    assert os.getpid() != pid
