"""The supervisor under server faults that are not network errors, under outages at boot,
and under handlers that kill their own process: it stays up, says so, and resumes."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis, free_port, server_binary

import echomq

from .conftest import ROOT, Supervisor, wait_until

Start = Callable[..., Supervisor]


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    """A private server whose protected configs (``dir``) can be changed at run time."""
    if server_binary() is None:
        pytest.skip("needs a redis-server/valkey-server binary")
    srv = LocalRedis(extra_args=("--enable-protected-configs", "yes")).start()
    try:
        yield srv
    finally:
        srv.stop()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _ran(r: redis.Redis, queue: str) -> Counter[str]:
    return Counter(x.decode() for x in r.lrange(f"ledger:{queue}:done", 0, -1))


@dataclass
class Fault:
    """A server condition that refuses writes: ``apply`` then ``clear`` on a live server."""

    code: str
    apply: Callable[[redis.Redis, LocalRedis], None]
    clear: Callable[[redis.Redis, LocalRedis], None]


def _oom_on(c: redis.Redis, s: LocalRedis) -> None:
    c.config_set("maxmemory-policy", "noeviction")
    c.config_set("maxmemory", "1")


def _readonly_on(c: redis.Redis, s: LocalRedis) -> None:
    c.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a primary that never answers


def _misconf_on(c: redis.Redis, s: LocalRedis) -> None:
    gone = tempfile.mkdtemp(prefix="echomq-gone-")
    c.config_set("save", "3600 1")
    c.config_set("dir", gone)
    shutil.rmtree(gone)  # the next snapshot cannot be written
    c.bgsave()
    wait_until(lambda: c.info("persistence")["rdb_last_bgsave_status"] == "err", 10,
               "a failed snapshot")


def _misconf_off(c: redis.Redis, s: LocalRedis) -> None:
    c.config_set("dir", s.workdir)
    c.bgsave()
    wait_until(lambda: c.info("persistence")["rdb_last_bgsave_status"] == "ok", 10,
               "a good snapshot")


class _BusyScript:
    """A script that keeps the server busy until told to end (it polls a key it cannot see
    change, so it ends by its own clock): every other client gets BUSY meanwhile."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None

    def on(self, c: redis.Redis, s: LocalRedis) -> None:
        c.config_set("busy-reply-threshold", "50")
        own = redis.Redis.from_url(s.url)
        spin = ("local t = redis.call('TIME') local stop = t[1] * 1000000 + t[2] + ARGV[1] "
                "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop return 1")
        self.thread = threading.Thread(target=own.eval, args=(spin, 0, 3_000_000), daemon=True)
        self.thread.start()
        probe = redis.Redis.from_url(s.url)

        def busy() -> bool:
            try:
                probe.ping()
                return False
            except redis.exceptions.ResponseError as exc:
                return "BUSY" in str(exc)

        wait_until(busy, 10, "the server to answer BUSY")

    def off(self, c: redis.Redis, s: LocalRedis) -> None:
        assert self.thread is not None
        self.thread.join(15)  # the script ends by its own clock; it may not be killed mid-write


_busy = _BusyScript()

FAULTS = [
    Fault("OOM", _oom_on, lambda c, s: c.config_set("maxmemory", "0")),
    Fault("READONLY", _readonly_on, lambda c, s: c.execute_command("REPLICAOF", "NO", "ONE")),
    Fault("NOREPLICAS", lambda c, s: c.config_set("min-replicas-to-write", "1"),
          lambda c, s: c.config_set("min-replicas-to-write", "0")),
    Fault("MISCONF", _misconf_on, _misconf_off),
    Fault("BUSY", _busy.on, _busy.off),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.code for f in FAULTS])
def test_a_server_refusing_writes_does_not_kill_the_supervisor(
        supervisor: Start, server: LocalRedis, redis_url: str, r: redis.Redis, queue_name: str,
        fault: Fault) -> None:
    """A job is running and another falls due while the server refuses writes: the
    supervisor stays up, shows the refusal in /readyz, /metrics and one log line, keeps the
    running job's outcome, and resumes on its own once the fault is cleared."""
    port = free_port()
    sup = supervisor(server.url, queue_name, "--processes", "1", "--beat-ms", "200",
                     "--health-port", str(port),
                     env={"ECHOMQ_TEST_LEDGER_URL": redis_url}).started(1)  # ledger elsewhere
    base = f"http://127.0.0.1:{port}"
    admin = redis.Redis.from_url(server.url)
    q = echomq.Queue(queue_name, redis_url=server.url)
    wait_until(lambda: _get(base + "/readyz")[0] == 200, 10, "ready")
    running = q.add("x", {"sleep": 1.0})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the job to start")
    due = q.add("x", {}, delay=0.3)  # falls due during the fault: promote is refused
    fault.apply(admin, server)
    try:
        def refused() -> bool:
            code, body = _get(base + "/readyz")
            state = json.loads(body)["queues"][queue_name].get("valkey", "")
            return code == 503 and fault.code in state

        wait_until(refused, 15, f"{fault.code} in /readyz")
        _, metrics = _get(base + "/metrics")
        assert f'echomq_valkey_available{{queue="{queue_name}"}} 0.0' in metrics
        assert f'echomq_valkey_refusals_total{{code="{fault.code}",queue="{queue_name}"}}' \
            in metrics
        assert sup.proc.poll() is None, sup.log
        # the refusal lasts several beats; the log says so once
        sup.wait_for_log(r"refus", 1)
    finally:
        fault.clear(admin, server)
    wait_until(lambda: _ran(r, queue_name)[running] == 1 and _ran(r, queue_name)[due] == 1,
               20, "both jobs to complete after the fault")
    wait_until(lambda: _get(base + "/readyz")[0] == 200, 15, "ready again")
    assert sup.proc.poll() is None, sup.log
    assert r.llen(f"ledger:{queue_name}:started") == 2  # the running job ran once
    job = q.get(running)
    assert job is not None and job.state == "completed" and job.stalls == 0
    assert len([line for line in sup.lines if "refus" in line]) == 1, sup.log
    sup.wait_for_log(r"available again")
    assert "Traceback" not in sup.log, sup.log


def test_children_wait_for_valkey_at_boot_and_start_within_a_beat_of_it(
        supervisor: Start, redis_url: str, r: redis.Redis, queue_name: str) -> None:
    """Started while Valkey is down: no consumer is forked (so none crash-loops with a
    traceback); once Valkey answers, consumers start and work runs within a few beats."""
    if server_binary() is None:
        pytest.skip("needs a redis-server/valkey-server binary")
    srv = LocalRedis()
    sup = supervisor(srv.url, queue_name, "--processes", "2", "--beat-ms", "200",
                     env={"ECHOMQ_TEST_LEDGER_URL": redis_url})
    try:
        sup.wait_for_log(r"unreachable", 1, timeout=15)
        # let the outage last (waiting on an exit that must not come): a respawn backoff
        # grown during it would delay recovery by many seconds
        with pytest.raises(subprocess.TimeoutExpired):
            sup.proc.wait(6)
        assert "consumer" not in "\n".join(
            line for line in sup.lines if "started" in line or "exit" in line), sup.log
        srv.start()
        sup.started(2)
        q = echomq.Queue(queue_name, redis_url=srv.url)
        job = q.add("x", {})
        wait_until(lambda: _ran(r, queue_name)[job] == 1, 5, "the first job after the outage")
        assert "Traceback" not in sup.log, sup.log
        assert "respawn in" not in sup.log, sup.log
    finally:
        sup.stop()
        srv.stop()


def test_a_handler_exiting_with_3_is_a_crash_not_a_boot_failure(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    q.add("x", {"exit": 3})
    sup.wait_for_log(r"consumer \d+ exited with 3")
    sup.wait_for_log(r"consumer \d+ started", 2)  # respawned: the supervisor went on
    ok = q.add("x", {})
    wait_until(lambda: _ran(r, queue_name)[ok] == 1, 15, "a healthy job after the exit")
    assert sup.proc.poll() is None, sup.log
    assert "could not load handler" not in sup.log


BOOT_FAILING_ARBITER = """
import sys
from echomq.supervisor import logs
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.settings import QueueSpec, Settings
logs.setup(False)
# durability "sync" opens the floor in each consumer: an unusable floor URL fails its boot
spec = QueueSpec(name=sys.argv[2], handler="sup_jobs:record", processes=2, durability="sync")
settings = Settings(redis_url=sys.argv[1], queues=(spec,), floor_url="nosuchdb://floor")
raise SystemExit(Arbiter(settings).run())
"""


def test_a_consumer_that_cannot_boot_stops_the_supervisor(redis_url: str,
                                                          queue_name: str) -> None:
    """Boot failure is told by the consumer's BOOTFAIL line: the supervisor stops with the
    boot-failure code instead of respawning forever."""
    done = subprocess.run([sys.executable, "-c", BOOT_FAILING_ARBITER, redis_url, queue_name],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}/tests/supervisor:{ROOT}",
                               "ECHOMQ_TEST_LEDGER_URL": redis_url})
    assert done.returncode == 3, done.stderr
    assert "could not start" in done.stderr and "unsupported floor URL" in done.stderr
    assert done.stderr.count("started") <= 3, done.stderr  # the start line and two consumers


def test_a_handler_that_crashes_now_and_then_is_not_a_crash_loop(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """Every fourth job takes its process down once; the processes between settled work,
    so each respawn is immediate (a crash loop is a process that gets nothing done). A
    settle goes out behind the next claim, so a process can die before it reads that its
    settle landed: the supervisor counts what the server recorded."""
    q = echomq.Queue(queue_name, redis_url=redis_url, max_stalls=10)
    ids = q.add_many([("x", {"exit_first": 1} if i % 4 == 3 else {}, {"lane": "one"})
                      for i in range(24)])
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    wait_until(lambda: set(_ran(r, queue_name)) == set(ids), 30, "every job")
    # how many: a crash hands back its whole batch, so later exit_first jobs may come back
    # on attempt 2 and not exit
    assert len(sup.wait_for_log(r"consumer \d+ exited with 1", 2)) >= 2
    assert "respawn in" not in sup.log, sup.log


def test_a_doorbell_closed_by_the_server_marks_the_queue_down_instead_of_crashing(
        private_redis: LocalRedis, queue_name: str) -> None:
    """The server closes the doorbell's connection between two turns of the loop (the
    close arrives after the selector returned for something else): the next turn must
    take the queue down and reconnect later, not raise out of the loop."""
    from echomq.supervisor.arbiter import Arbiter
    from echomq.supervisor.children import Child
    from echomq.supervisor.holdings import Holdings
    from echomq.supervisor.protocol import LineReader
    from echomq.supervisor.settings import QueueSpec, Settings

    settings = Settings(redis_url=private_redis.url, beat_ms=200, queues=(
        QueueSpec(queue_name, "echomq.supervisor.drills.handler:handle"),))
    arbiter = Arbiter(settings)
    rt = arbiter.queues[queue_name]
    ours, theirs = socket.socketpair()
    # an idle consumer's record (no process is needed): it makes the loop arm the doorbell
    rt.slots[0].child = Child(queue=queue_name, slot=0, pid=0, sock=ours,
                              reader=LineReader(ours.fileno()), holdings=Holdings(1),
                              state="idle")
    try:
        arbiter.doorbells.arm_all(time.monotonic())
        bell = rt.metronome.doorbell
        assert bell.armed and bell.client_id is not None
        redis.Redis.from_url(private_redis.url).client_kill_filter(_id=bell.client_id)
        readable, _, _ = select.select([bell.fileno()], [], [], 10)
        assert readable  # the close has arrived; nobody has read it
        arbiter.doorbells.arm_all(time.monotonic())
        assert not rt.healthy and rt.availability.state == "unreachable"
    finally:
        ours.close()
        theirs.close()
        rt.metronome.doorbell.reset()


def test_a_refusal_longer_than_the_lease_does_not_run_the_job_twice(
        supervisor: Start, server: LocalRedis, redis_url: str, r: redis.Redis,
        queue_name: str) -> None:
    """The job finishes while the server refuses writes and its lease runs out meanwhile:
    once writes are taken again the consumer settles it before anything reaps it."""
    sup = supervisor(server.url, queue_name, "--processes", "1", "--beat-ms", "200",
                     "--lease-ms", "1000", env={"ECHOMQ_TEST_LEDGER_URL": redis_url}).started(1)
    admin = redis.Redis.from_url(server.url)
    q = echomq.Queue(queue_name, redis_url=server.url)
    job_id = q.add("x", {"sleep": 0.5})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the job to start")
    admin.config_set("min-replicas-to-write", "1")
    try:
        wait_until(lambda: _ran(r, queue_name)[job_id] == 1, 10, "the job's work to be done")
        sup.wait_for_log(r"refuses writes")
        # let the refusal outlast the lease (a wait on an exit that must not come)
        with pytest.raises(subprocess.TimeoutExpired):
            sup.proc.wait(2.0)
    finally:
        admin.config_set("min-replicas-to-write", "0")
    wait_until(lambda: q.get(job_id).state == "completed", 10,  # type: ignore[union-attr]
               "the job settled")
    job = q.get(job_id)
    assert job is not None and job.stalls == 0 and job.attempts == 1
    assert r.llen(f"ledger:{queue_name}:started") == 1, sup.log  # it ran once


def test_start_against_a_server_out_of_memory_waits_then_runs(
        supervisor: Start, server: LocalRedis, redis_url: str, r: redis.Redis,
        queue_name: str) -> None:
    """``maxmemory`` reached before the supervisor starts (the manifests choose noeviction):
    it starts, forks nothing and says why, then runs once memory is freed."""
    port = free_port()
    admin = redis.Redis.from_url(server.url)
    q = echomq.Queue(queue_name, redis_url=server.url)
    job_id = q.add("x", {})
    _oom_on(admin, server)
    try:
        sup = supervisor(server.url, queue_name, "--processes", "2", "--beat-ms", "200",
                         "--health-port", str(port),
                         env={"ECHOMQ_TEST_LEDGER_URL": redis_url})
        sup.wait_for_log(r"refuses writes \(OOM")
        code, body = _get(f"http://127.0.0.1:{port}/readyz")
        assert code == 503 and "OOM" in json.loads(body)["queues"][queue_name]["valkey"]
        assert sup.proc.poll() is None and "started" not in sup.log.split("supervisor started")[1]
    finally:
        admin.config_set("maxmemory", "0")
    sup.started(2)
    wait_until(lambda: _ran(r, queue_name)[job_id] == 1, 10, "the job after memory was freed")
    assert "Traceback" not in sup.log, sup.log
