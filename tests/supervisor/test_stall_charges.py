"""What a job is charged when the supervisor, not the job, ends its run."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import psutil
import redis
from echomq.supervisor.drills.localredis import LocalRedis

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


def test_a_job_running_beside_one_that_kills_its_process_does_not_go_dead_with_it(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "1", "--concurrency", "2").started(1)
    started = f"ledger:{queue_name}:started"

    def runs(job_id: str) -> int:
        return sum(1 for x in r.lrange(started, 0, -1) if x.decode().startswith(job_id + ":"))

    # the innocent job runs (held at its gate) when the killer joins it in the process:
    # both run when it dies, so neither is charged and each runs alone next time
    innocent = q.add("x", {"gate": True})
    wait_until(lambda: runs(innocent) == 1, 10, "the innocent job to run")
    killer = q.add("x", {"exit": 9})

    # the innocent one's second run is a lone one: the killer waits beside it, unstarted
    wait_until(lambda: runs(innocent) == 2, 20, "the innocent job to run again, alone")
    assert runs(killer) == 1
    r.rpush(f"ledger:{queue_name}:gate", 1)
    wait_until(lambda: q.get(innocent).state == "completed", 15,  # type: ignore[union-attr]
               "the innocent job to complete")
    # the killer then runs alone and is charged each crash: dead after max_stalls (1) + 1
    wait_until(lambda: q.get(killer).state == "dead", 20,  # type: ignore[union-attr]
               "the process-killing job to go dead")
    job = q.get(innocent)
    assert job is not None and job.stalls == 0, job
    dead = q.get(killer)
    assert dead is not None and dead.stalls == 2 and runs(killer) == 3, (dead, runs(killer))


def test_a_time_limit_kill_does_not_run_the_batchs_finished_jobs_again(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "1").started(1)
    # the first claim after a poke takes one job; the next ones, settled with the last, take
    # batches of up to claim_batch (16) fast jobs: the slow one shares a batch with fast ones
    # that finished before it started
    fast = [("x", {}, {"max_attempts": 1}) for _ in range(30)]
    ids = q.add_many([*fast, ("x", {"sleep": 30}, {"timeout": 0.5, "max_attempts": 1})])
    wait_until(lambda: q.get(ids[-1]).state == "dead", 20,  # type: ignore[union-attr]
               "the slow job to fail at its limit")
    wait_until(lambda: all(q.get(j).state == "completed" for j in ids[:-1]),  # type: ignore
               15, "the fast jobs to complete")
    started = [raw.decode().rsplit(":", 2)[0]
               for raw in r.lrange(f"ledger:{queue_name}:started", 0, -1)]
    assert [j for j in ids[:-1] if started.count(j) != 1] == []  # each ran once


def test_a_job_leased_by_a_process_killed_before_it_held_it_is_not_charged(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--lease-ms", "1000").started(1)
    [child] = psutil.Process(sup.proc.pid).children()
    ports = {f"{c.laddr.ip}:{c.laddr.port}" for c in child.net_connections("tcp")}
    # the first claim after the poke takes the first job alone; its return pauses the
    # server's writes, so the settle fused with the claim of the second waits there
    first, second = q.add_many([("x", {"pause_writes": 1500}), ("x", {})])

    def claim_waits() -> bool:
        ports.update(f"{c.laddr.ip}:{c.laddr.port}" for c in child.net_connections("tcp"))
        return any(c["addr"] in ports and "b" in c["flags"] and c["cmd"] == "evalsha"
                   for c in r.client_list())

    wait_until(claim_waits, 15, "the consumer's settle and claim to wait for the server")
    os.kill(child.pid, signal.SIGSTOP)  # the claim goes through; its reply is never read
    wait_until(lambda: q.get(second).state == "active", 10,  # type: ignore[union-attr]
               "the second job to be leased")
    os.kill(child.pid, signal.SIGKILL)
    wait_until(lambda: q.get(second).state == "completed", 15,  # type: ignore[union-attr]
               "the second job to run")
    job = q.get(second)
    assert job is not None and job.stalls == 0, job
    assert q.get(first).state == "completed"  # type: ignore[union-attr]


def test_jobs_of_a_claim_whose_reply_was_lost_go_back_uncharged(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_payload_bytes=8 << 20)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--lease-ms", "2000").started(1)
    [child] = psutil.Process(sup.proc.pid).children()
    # the claim fused with the first job's settle leases big jobs: a reply far larger than
    # the socket buffers, so most of it is still in the server when the connection goes
    q.pause()  # every job admitted before the first claim
    first, *big = q.add_many([("x", {"pause_writes": 1500}),
                              *[("x", {"blob": "b" * (6 << 20)}) for _ in range(10)]])
    q.resume()
    waiting: list[int] = []

    def claim_waits() -> bool:
        ports = {f"{c.laddr.ip}:{c.laddr.port}" for c in child.net_connections("tcp")}
        waiting[:] = [int(c["id"]) for c in r.client_list() if c["addr"] in ports
                      and "b" in c["flags"] and c["cmd"] == "evalsha"]
        return bool(waiting)

    wait_until(claim_waits, 15, "the consumer's settle and claim to wait for the server")
    os.kill(child.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: q.get(big[0]).state == "active", 10,  # type: ignore[union-attr]
                   "the big jobs to be leased")
        r.client_kill_filter(_id=waiting[0])  # the reply is lost; the consumer lives on
    finally:
        os.kill(child.pid, signal.SIGCONT)
    wait_until(lambda: all(q.get(j).state == "completed" for j in big),  # type: ignore
               30, "the big jobs to run")
    assert child.is_running()
    assert [q.get(j).stalls for j in big] == [0] * len(big)  # type: ignore[union-attr]


def test_jobs_of_a_consumer_that_died_while_the_server_was_down_are_not_charged(
        supervisor: Start, queue_name: str) -> None:
    server = LocalRedis(appendonly=True, extra_args=("--appendfsync", "always")).start()
    try:
        q = echomq.Queue(queue_name, redis_url=server.url)
        sup = supervisor(server.url, queue_name, "--processes", "1", "--lease-ms", "1000",
                         "--beat-ms", "100").started(1)
        [child] = psutil.Process(sup.proc.pid).children()
        job_id = q.add("x", {"sleep": 1.0})
        wait_until(lambda: q.get(job_id).state == "active", 10,  # type: ignore[union-attr]
                   "the job to run")
        server.kill()  # its settle fails: the outcome is kept, the job still leased
        sup.wait_for_log(r"server unreachable while draining")
        child.kill()  # the supervisor cannot hand the job back now
        child.wait(10)
        sup.wait_for_log(rf"consumer {child.pid} killed by SIGKILL")
        server.start()  # on its append-only file: the lease is there, nobody extended it
        wait_until(lambda: q.get(job_id).state in ("completed", "dead"), 20,  # type: ignore
                   "the job to run again")
        job = q.get(job_id)
        assert job is not None and job.state == "completed" and job.stalls == 0, job
    finally:
        server.stop()


def test_a_stop_while_the_server_refuses_writes_keeps_the_finished_outcome(
        supervisor: Start, private_redis: LocalRedis, queue_name: str) -> None:
    url = private_redis.url
    r = redis.Redis.from_url(url)
    q = echomq.Queue(queue_name, redis_url=url)
    sup = supervisor(url, queue_name, "--processes", "1", "--lease-ms", "1000",
                     "--beat-ms", "100", "--handler", "sup_stop:refuse_and_stop").started(1)
    # fast jobs first: the runner's average makes the next claims take batches
    warm = q.add_many([("x", {}) for _ in range(30)])
    wait_until(lambda: q.counts()["completed"] == len(warm), 15, "the warm-up jobs")
    # the first claim after the poke takes one job; the next takes the rest as one batch,
    # and the first of them stops the process while the server refuses writes
    ids = q.add_many([("x", {}), ("x", {"refuse": True}), ("x", {}), ("x", {})])
    refusing = ids[1]
    try:
        # the consumer's first write after the job is refused (the supervisor is paused)
        wait_until(lambda: r.info("errorstats").get("errorstat_NOREPLICAS", {}).get(
            "count", 0) >= 1, 15, "the consumer's refused write")
    finally:
        r.config_set("min-replicas-to-write", 0)
        sup.signal(signal.SIGCONT)
    wait_until(lambda: all(q.get(j).state == "completed" for j in ids),  # type: ignore
               20, "every job to complete")
    started = [x.decode() for x in r.lrange(f"ledger:{queue_name}:started", 0, -1)]
    assert started.count(refusing) == 1, started.count(refusing)
