"""Leases that ran out while the server was down belong to running jobs: no reaper hands
them out again before their holders had a lease period to extend them.

The server is SIGKILLed and started again on its append-only file after more than a
lease, with one job running in a standalone consumer and a supervisor beside it. The
holder is paused (SIGSTOP) across the outage and for a while after the server is back,
so the other reaper, had it reaped at once, would have handed the job out again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis, server_binary

import echomq

from .conftest import HERE, ROOT, Supervisor, wait_until

# the grace each reaper gives after its return is this long: the test's own steps between
# a return and the holder's extension must fit in it on a loaded machine
LEASE_MS = 4000
BEAT_MS = 200
CONSUMER = """
import echomq, sup_jobs
echomq.Consumer({queue!r}, sup_jobs.record, redis_url={url!r}, beat_ms={beat},
                lease_ms={lease}).run()
"""


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    """A private server that keeps every write across a SIGKILL (appendfsync always)."""
    if server_binary() is None:
        pytest.skip("needs a redis-server/valkey-server binary")
    srv = LocalRedis(appendonly=True, workdir=tempfile.mkdtemp(prefix="echomq-outage-"),
                     extra_args=("--appendfsync", "always")).start()
    try:
        yield srv
    finally:
        srv.kill()


def _consumer(queue: str, url: str, ledger_url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
           "ECHOMQ_TEST_LEDGER_URL": ledger_url}
    code = CONSUMER.format(queue=queue, url=url, beat=BEAT_MS, lease=LEASE_MS)
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def _supervise(supervisor: type[Supervisor], server: LocalRedis, queue: str, ledger_url: str,
               lease_ms: int) -> Supervisor:
    """A supervisor of one consumer process on the private server, started."""
    return supervisor(server.url, queue, "--processes", "1", "--beat-ms", str(BEAT_MS),
                      "--lease-ms", str(lease_ms),
                      env={"ECHOMQ_TEST_LEDGER_URL": ledger_url}).started(1)


def _outage_longer_than_the_lease(server: LocalRedis) -> None:
    server.kill()
    threading.Event().wait(LEASE_MS / 1000 + 0.5)  # the outage outlasts every lease
    server.start()


def _parked(server: LocalRedis, after_id: int = 0) -> int:
    """How many clients wait in a blocking call (a consumer's doorbell, a metronome's);
    ``after_id``: of those connected after that client id only."""
    with redis.Redis.from_url(server.url) as c:
        return sum(1 for client in c.client_list()
                   if "b" in client.get("flags", "") and int(client["id"]) > after_id)


def _last_client_id(server: LocalRedis) -> int:
    with redis.Redis.from_url(server.url) as c:
        return max(int(client["id"]) for client in c.client_list())


def _extended_after_the_return(server: LocalRedis, q: echomq.Queue, job_id: str) -> bool:
    """True once the job's lease reaches past half a lease from the server's now."""
    with redis.Redis.from_url(server.url) as c:
        score = c.zscore(q.keys.leases, job_id)
        secs, micros = c.time()
    return score is not None and score > secs * 1000 + micros / 1000 + LEASE_MS / 2


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGCONT)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_the_supervisor_leaves_a_standalone_consumers_lapsed_lease_a_lease_period(
        supervisor: type[Supervisor], server: LocalRedis, redis_url: str, r: redis.Redis,
        queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=server.url)
    consumer = _consumer(queue_name, server.url, redis_url)
    try:
        job_id = q.add("x", {"gate": True})
        wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 15,
                   "the standalone consumer to start the job")
        sup = _supervise(supervisor, server, queue_name, redis_url, LEASE_MS)
        consumer.send_signal(signal.SIGSTOP)  # its heartbeat cannot extend the lease
        _outage_longer_than_the_lease(server)
        sup.wait_for_log(r"Valkey available again")
        # a reap a beat after the supervisor's return would hand the job to its child
        with pytest.raises(AssertionError):
            sup.wait_for_log(r"lease\(s\) expired", timeout=4 * BEAT_MS / 1000)
        consumer.send_signal(signal.SIGCONT)  # within the lease period: it extends
        r.rpush(f"ledger:{queue_name}:gate", "go")
        wait_until(lambda: (j := q.get(job_id)) is not None and j.state == "completed", 15,
                   "the job to complete")
        job = q.get(job_id)
        assert job is not None and job.attempts == 1 and job.stalls == 0
        assert r.llen(f"ledger:{queue_name}:started") == 1, sup.log  # it ran once
        assert "lease(s) expired" not in sup.log
    finally:
        _stop(consumer)
        q.close()


def test_a_standalone_consumer_leaves_a_supervised_lapsed_lease_a_lease_period(
        supervisor: type[Supervisor], server: LocalRedis, redis_url: str, r: redis.Redis,
        queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=server.url)
    sup = _supervise(supervisor, server, queue_name, redis_url, LEASE_MS)
    job_id = q.add("x", {"gate": True})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 15,
               "the supervisor's consumer to start the job")
    before = _last_client_id(server)
    consumer = _consumer(queue_name, server.url, redis_url)
    try:
        # parked on its doorbell (a connection of its own, newer than the supervisor's;
        # the metronome does not park while its only consumer is busy): its loop runs
        wait_until(lambda: _parked(server, before) >= 1, 15, "the standalone consumer to park")
        sup.proc.send_signal(signal.SIGSTOP)  # the supervisor extends its consumer's leases
        try:
            _outage_longer_than_the_lease(server)
            # parked again: its loop ran once since it reconnected, a reap at once included
            wait_until(lambda: _parked(server) >= 1, 15, "the standalone consumer to return")
            held = q.get(job_id)
            assert held is not None and held.state == "active" and held.attempts == 1, held
        finally:
            sup.proc.send_signal(signal.SIGCONT)
        r.rpush(f"ledger:{queue_name}:gate", "go")
        wait_until(lambda: (j := q.get(job_id)) is not None and j.state == "completed", 15,
                   "the job to complete")
        job = q.get(job_id)
        assert job is not None and job.attempts == 1 and job.stalls == 0
        assert r.llen(f"ledger:{queue_name}:started") == 1  # it ran once
    finally:
        _stop(consumer)
        q.close()


def test_a_consumer_running_a_job_through_the_outage_leaves_lapsed_leases_a_lease_period(
        supervisor: type[Supervisor], server: LocalRedis, redis_url: str, r: redis.Redis,
        queue_name: str) -> None:
    # the standalone consumer's main loop runs its own job all through the outage: only its
    # heartbeat sees the server away, and that holds its next reap as well
    q = echomq.Queue(queue_name, redis_url=server.url)
    sup = _supervise(supervisor, server, queue_name, redis_url, LEASE_MS)
    theirs = q.add("x", {"gate": "theirs"})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 15,
               "the supervisor's consumer to start its job")
    consumer = _consumer(queue_name, server.url, redis_url)
    try:
        ours = q.add("x", {"gate": "ours"})  # the supervisor's one consumer is busy
        wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 2, 15,
                   "the standalone consumer to start its job")
        sup.proc.send_signal(signal.SIGSTOP)  # the supervisor extends its consumer's leases
        try:
            _outage_longer_than_the_lease(server)
            # back: the standalone consumer's heartbeat extends its own lease
            wait_until(lambda: _extended_after_the_return(server, q, ours), 15,
                       "the standalone consumer's heartbeat to extend its job's lease")
            r.rpush(f"ledger:{queue_name}:gate:ours", "go")
            wait_until(lambda: (j := q.get(ours)) is not None and j.state == "completed", 15,
                       "the standalone consumer's job to complete")
            # parked: its loop went on past its job and its reap, had it reaped at once
            wait_until(lambda: _parked(server) >= 1, 15, "the standalone consumer to park")
            held = q.get(theirs)
            assert held is not None and held.state == "active" and held.attempts == 1, held
        finally:
            sup.proc.send_signal(signal.SIGCONT)
        r.rpush(f"ledger:{queue_name}:gate:theirs", "go")
        wait_until(lambda: (j := q.get(theirs)) is not None and j.state == "completed", 15,
                   "the supervisor's consumer's job to complete")
        job = q.get(theirs)
        assert job is not None and job.attempts == 1 and job.stalls == 0
        assert r.llen(f"ledger:{queue_name}:started") == 2  # each ran once
    finally:
        _stop(consumer)
        q.close()


def test_blips_shorter_than_a_third_of_a_lease_do_not_hold_the_reap_of_a_dead_consumer(
        supervisor: type[Supervisor], server: LocalRedis, redis_url: str, r: redis.Redis,
        queue_name: str) -> None:
    # the server is restarted (on its append-only file) every 3/4 of a lease, each time
    # down for a fifth of a lease: too short for a live lease to run out, so the job of a
    # standalone consumer SIGKILLed mid-job is reaped when its lease runs out all the same
    lease_ms = 3000
    q = echomq.Queue(queue_name, redis_url=server.url)
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER.format(
        queue=queue_name, url=server.url, beat=BEAT_MS, lease=lease_ms)],
        env={**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
             "ECHOMQ_TEST_LEDGER_URL": redis_url})
    job_id = q.add("x", {"gate": "second"})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 15,
               "the standalone consumer to start the job")
    consumer.kill()
    consumer.wait()
    sup = _supervise(supervisor, server, queue_name, redis_url, lease_ms)
    stop = threading.Event()

    def blips() -> None:
        while not stop.wait(0.75 * lease_ms / 1000):
            server.kill()
            threading.Event().wait(0.2 * lease_ms / 1000)  # the blip's length
            server.start()

    blipper = threading.Thread(target=blips, daemon=True)
    blipper.start()
    try:
        r.rpush(f"ledger:{queue_name}:gate:second", "go")  # the second run may finish
        wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 2, 4 * lease_ms / 1000,
                   "the dead consumer's job to be reaped and run again while the blips go on")
        assert len(sup.wait_for_log(r"Valkey unreachable", count=2, timeout=10)) >= 2
    finally:
        stop.set()
        blipper.join(10)
    wait_until(lambda: (j := q.get(job_id)) is not None and j.state == "completed", 15,
               "the job to complete")
    q.close()


def test_a_server_out_of_memory_refusing_the_extensions_reaps_nothing(
        supervisor: type[Supervisor], server: LocalRedis, redis_url: str, r: redis.Redis,
        queue_name: str) -> None:
    # under noeviction, out of memory refuses a lease's extension (its first write may grow
    # memory) but not a reap (its first write frees some): the refused extension marks the
    # queue down, so nothing reaps its running job until the server takes writes again
    lease_ms = 2000
    q = echomq.Queue(queue_name, redis_url=server.url)
    sup = _supervise(supervisor, server, queue_name, redis_url, lease_ms)
    job_id = q.add("x", {"gate": "oom"})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 15,
               "the supervisor's consumer to start the job")
    with redis.Redis.from_url(server.url) as admin:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        try:
            # twice the lease: a reap on its beat would have handed the job out again
            with pytest.raises(AssertionError):
                sup.wait_for_log(r"lease\(s\) expired", timeout=2 * lease_ms / 1000)
            assert "refuses writes" in sup.log
        finally:
            admin.config_set("maxmemory", "0")
    r.rpush(f"ledger:{queue_name}:gate:oom", "go")
    wait_until(lambda: (j := q.get(job_id)) is not None and j.state == "completed", 15,
               "the job to complete")
    job = q.get(job_id)
    assert job is not None and job.attempts == 1 and job.stalls == 0
    assert r.llen(f"ledger:{queue_name}:started") == 1, sup.log  # it ran once
    q.close()
