"""The delivery promise on the consumer side, with the interleavings forced.

Each test holds a job at a chosen point (a gate the handler waits on, a paused
child, a stopped server) and checks what the supervisor knows and does then.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis, server_binary

import echomq
from echomq import scripts
from echomq.keys import Keys

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


@pytest.fixture
def aof_server() -> Iterator[LocalRedis]:
    """A private server that keeps its data over a kill (append-only, fsync always)."""
    if server_binary() is None:
        pytest.skip("needs a redis-server/valkey-server binary to kill and restart")
    server = LocalRedis(appendonly=True, extra_args=("--appendfsync", "always")).start()
    try:
        yield server
    finally:
        server.stop()


def _started(r: redis.Redis, queue: str) -> list[tuple[str, int, int]]:
    out = []
    for raw in r.lrange(f"ledger:{queue}:started", 0, -1):
        job_id, pid, attempts = raw.decode().rsplit(":", 2)
        out.append((job_id, int(pid), int(attempts)))
    return out


def _lease(client: redis.Redis, queue: str, job_id: str) -> float:
    return float(client.zscore(Keys(queue).leases, job_id) or 0)


def _settle_failed(server: LocalRedis, sup: Supervisor, r: redis.Redis, queue: str) -> int:
    """Run one gated job, stop the server while it runs, let it finish: its settle fails.
    Returns the pid of the consumer that keeps the unsettled outcome."""
    q = echomq.Queue(queue, redis_url=server.url)
    q.add("x", {"gate": True}, job_id="held")
    wait_until(lambda: r.llen(f"ledger:{queue}:started") == 1, 10, "the job to start")
    [(_, pid, _)] = _started(r, queue)
    server.kill()  # fsync always: nothing acknowledged is lost
    r.rpush(f"ledger:{queue}:gate", 1)
    sup.wait_for_log(r"unreachable while draining")
    return pid


# one job at a time (the sequential drain), or concurrent with an async handler
MODES = {"sequential": (), "concurrent": ("--concurrency", "4",
                                          "--handler", "sup_jobs:record_async")}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_failed_settle_keeps_the_job_held_by_the_parent(
        supervisor: Start, aof_server: LocalRedis, queue_name: str, r: redis.Redis,
        redis_url: str, mode: str) -> None:
    sup = supervisor(aof_server.url, queue_name, "--processes", "1", "--lease-ms", "1500",
                     "--beat-ms", "100", *MODES[mode],
                     env={"ECHOMQ_TEST_LEDGER_URL": redis_url}).started(1)
    pid = _settle_failed(aof_server, sup, r, queue_name)
    os.kill(pid, signal.SIGSTOP)  # the consumer cannot settle now: only the parent can act
    aof_server.start()
    client = redis.Redis.from_url(aof_server.url)
    before = _lease(client, queue_name, "held")
    assert before > 0
    wait_until(lambda: _lease(client, queue_name, "held") > before, 10,
               "the parent to extend the lease of the unsettled job")
    os.kill(pid, signal.SIGKILL)
    sup.wait_for_log(rf"consumer {pid} killed by SIGKILL, released 1 job")
    r.rpush(f"ledger:{queue_name}:gate", 1)  # its second run passes the gate at once
    q = echomq.Queue(queue_name, redis=client)
    wait_until(lambda: q.get("held").state == "completed", 15,  # type: ignore[union-attr]
               "the job to run again")
    job = q.get("held")
    assert job is not None and job.stalls == 0 and job.attempts == 1  # it had finished
    client.close()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sigterm_does_not_exit_with_unsettled_outcomes(
        supervisor: Start, aof_server: LocalRedis, queue_name: str, r: redis.Redis,
        redis_url: str, mode: str) -> None:
    sup = supervisor(aof_server.url, queue_name, "--processes", "1", "--beat-ms", "100",
                     "--drain-timeout", "20", *MODES[mode],
                     env={"ECHOMQ_TEST_LEDGER_URL": redis_url}).started(1)
    pid = _settle_failed(aof_server, sup, r, queue_name)
    sup.signal(signal.SIGTERM)
    sup.wait_for_log(rf"consumer {pid} exited|unsettled outcome")
    aof_server.start()
    assert sup.wait(30) == 0
    q = echomq.Queue(queue_name, redis_url=aof_server.url)
    job = q.get("held")
    assert job is not None and job.state == "completed" and job.attempts == 1
    assert len(_started(r, queue_name)) == 1


def test_a_job_killed_at_the_drain_timeout_counts_a_stall(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1",
                     "--drain-timeout", "0.5").started(1)
    job_id = q.add("x", {"gate": True})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the hung job")
    sup.signal(signal.SIGTERM)
    assert sup.wait(15) == 0
    job = q.get(job_id)
    assert job is not None and job.state == "waiting" and job.stalls == 1
    assert job.attempts == 1


def test_a_crash_charges_only_the_running_job_of_its_batch(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    # two warm-up jobs make the runner's batch size large before the crashing batch
    ids = q.add_many([("x", {}, {"job_id": f"j{i:02d}"}) for i in range(3)])
    ids += q.add_many([("x", {"exit": 9}, {"job_id": "j03"})])
    ids += q.add_many([("x", {}, {"job_id": f"j{i:02d}"}) for i in range(4, 30)])
    sup = supervisor(redis_url, queue_name, "--processes", "1")
    sup.wait_for_log(r"killed by|exited with 9", 2, timeout=30)
    wait_until(lambda: q.counts()["completed"] == 29 and q.counts()["dead"] == 1, 30,
               "every job settled")
    dead = q.dead()
    assert [j.id for j in dead] == ["j03"] and "stalled 2 times" in (dead[0].error or "")
    for job_id in ids:
        if job_id != "j03":
            job = q.get(job_id)
            assert job is not None and job.state == "completed", job
            assert job.stalls == 0, job  # finished or never started: no charge
    # jobs handed back unstarted keep their order: first starts follow the ids
    first: dict[str, int] = {}
    for n, (job_id, _, _) in enumerate(_started(r, queue_name)):
        first.setdefault(job_id, n)
    assert sorted(first, key=first.__getitem__) == sorted(first)
    runs = Counter(job_id for job_id, _, _ in _started(r, queue_name))
    assert runs["j03"] == 2


def test_leases_are_extended_during_a_sigterm_drain(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--lease-ms", "600",
                     "--drain-timeout", "20").started(1)
    job_id = q.add("x", {"gate": True})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the job to start")
    sup.signal(signal.SIGTERM)
    sup.wait_for_log(r"draining")
    before = _lease(r, queue_name, job_id)
    wait_until(lambda: _lease(r, queue_name, job_id) > before + 600, 10,
               "the lease to be extended while draining")
    # another replica's reap finds nothing to take
    assert scripts.reap(r, Keys(queue_name))[0] == 0
    r.rpush(f"ledger:{queue_name}:gate", 1)
    assert sup.wait(20) == 0
    job = q.get(job_id)
    assert job is not None and job.state == "completed" and job.attempts == 1
