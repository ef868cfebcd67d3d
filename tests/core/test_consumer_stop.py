"""The standalone consumer as its own process: a stop by signal, and a crash by one job.

Real ``echomq.Consumer(...).run()`` subprocesses (standalone_proc.py), real signals,
``os._exit`` in a handler; executions are counted from the ledger the handler writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from echomq.supervisor.localredis import LocalRedis, server_binary

import echomq

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Re-check a condition until it holds; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


class Consumer:
    """A standalone consumer process; its output lines are collected as they come."""

    def __init__(self, url: str, queue: str, *args: str) -> None:
        self.lines: list[str] = []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "standalone_proc.py"), url, queue, *args], env=env,
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def ready(self) -> Consumer:
        wait_until(lambda: "ready" in self.lines or self.proc.poll() is not None, 30,
                   "the consumer to start")
        assert self.proc.poll() is None, self.output()
        return self

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s:\n{self.output()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def consumers() -> Iterator[Callable[..., Consumer]]:
    started: list[Consumer] = []

    def start(url: str, queue: str, *args: str) -> Consumer:
        started.append(Consumer(url, queue, *args))
        return started[-1]

    yield start
    for c in started:
        c.kill()


def _started(r: redis.Redis, queue: str) -> list[tuple[str, int, int]]:
    """(job id, pid, attempt) of every start, in order."""
    out = []
    for raw in r.lrange(f"ledger:{queue}:started", 0, -1):
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        job_id, pid, attempt = text.rsplit(":", 2)
        out.append((job_id, int(pid), int(attempt)))
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_signal_lets_running_jobs_finish_and_no_other_consumer_runs_them(
        redis_url: str, queue_name: str, r: redis.Redis,
        consumers: Callable[..., Consumer], concurrency: int, sig: signal.Signals) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    long = [f"long{i}" for i in range(concurrency)]
    short = ["short0", "short1"]
    q.add_many([("x", {"sleep": 6}, {"job_id": j}) for j in long])
    q.add_many([("x", {}, {"job_id": j}) for j in short])
    a = consumers(redis_url, queue_name, "--concurrency", str(concurrency))
    wait_until(lambda: len(_started(r, queue_name)) == concurrency, 30, "the long jobs to start")
    # a second consumer beside it takes what the first left on the lane, and nothing else
    b = consumers(redis_url, queue_name, "--concurrency", "4").ready()
    wait_until(lambda: q.counts()["completed"] == len(short), 30, "the short jobs")
    assert not r.lrange(f"ledger:{queue_name}:done", 0, -1) or \
        set(r.lrange(f"ledger:{queue_name}:done", 0, -1)) == {j.encode() for j in short}
    a.proc.send_signal(sig)
    assert a.wait(30) == 0, a.output()
    wait_until(lambda: q.counts()["completed"] == len(long) + len(short), 30, "every job")
    b.proc.send_signal(signal.SIGINT)
    assert b.wait(30) == 0, b.output()
    runs = Counter(job_id for job_id, _, _ in _started(r, queue_name))
    assert runs == Counter(long + short), _started(r, queue_name)
    assert {pid for job_id, pid, _ in _started(r, queue_name) if job_id in long} == \
        {a.proc.pid}
    for job_id in long:
        job = q.get(job_id)
        assert job is not None and job.state == "completed", job
        assert job.attempts == 1 and job.stalls == 0, job
    assert "lease expired" not in a.output() and "stale" not in a.output(), a.output()
    assert r.zcard(f"emq:{{{queue_name}}}:leases") == 0


@pytest.mark.parametrize(("mode", "sleep"), [
    (("--concurrency", "1"), 120),  # interrupted in the main thread
    (("--concurrency", "3", "--async"), 120),  # cancelled
    (("--concurrency", "2"), 4),  # runs on in its thread: the process exits once it returns
])
def test_a_stop_past_the_drain_timeout_hands_running_jobs_back_counting_a_stall(
        redis_url: str, queue_name: str, r: redis.Redis,
        consumers: Callable[..., Consumer], mode: tuple[str, ...], sleep: float) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    running = int(mode[1])
    ids = q.add_many([("x", {"sleep": sleep}, {"job_id": f"j{i}"}) for i in range(running)])
    a = consumers(redis_url, queue_name, *mode, "--drain-timeout", "0.5")
    wait_until(lambda: len(_started(r, queue_name)) == running, 30, "the jobs to start")
    t0 = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)
    assert a.wait(30) == 0, a.output()
    assert time.monotonic() - t0 < 15, a.output()
    for job_id in ids:
        job = q.get(job_id)
        # past the bound: back on the lane, charged like the supervisor's drain timeout
        assert job is not None and job.state == "waiting", job
        assert job.stalls == 1 and job.attempts == 1, job
    assert r.zcard(f"emq:{{{queue_name}}}:leases") == 0
    assert "drain timeout" in a.output() and "stale" not in a.output(), a.output()


def test_a_crash_charges_only_the_running_job_of_a_standalone_consumer(
        redis_url: str, queue_name: str, r: redis.Redis,
        consumers: Callable[..., Consumer]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    # fast jobs before it: a consumer that claims batches has grown them by then
    ids = q.add_many([("x", {}, {"job_id": f"j{i:02d}"}) for i in range(3)])
    ids += q.add_many([("x", {"exit": 9}, {"job_id": "j03"})])
    ids += q.add_many([("x", {}, {"job_id": f"j{i:02d}"}) for i in range(4, 30)])
    deadline = time.monotonic() + 90
    crashes = 0
    while not (q.counts()["completed"] == 29 and q.counts()["dead"] == 1):
        assert time.monotonic() < deadline, (q.counts(), _started(r, queue_name))
        c = consumers(redis_url, queue_name, "--lease-ms", "1000")
        # run until it dies, or until every job is settled
        wait_until(lambda: c.proc.poll() is not None  # noqa: B023
                   or (q.counts()["completed"] == 29 and q.counts()["dead"] == 1), 60,
                   "a crash or the end")
        if c.proc.poll() is not None:
            assert c.proc.returncode == 9, c.output()
            crashes += 1
        assert crashes <= 3, _started(r, queue_name)
    dead = q.dead()
    assert [j.id for j in dead] == ["j03"] and "stalled 2 times" in (dead[0].error or "")
    for job_id in ids:
        if job_id != "j03":
            job = q.get(job_id)
            assert job is not None and job.state == "completed", job
            assert job.stalls == 0, job  # finished or never started: no charge
    runs = Counter(job_id for job_id, _, _ in _started(r, queue_name))
    assert runs["j03"] == 2 and crashes == 2
    assert all(runs[j] == 1 for j in ids if j != "j03"), runs


@pytest.mark.parametrize("mode", [("--concurrency", "1"), ("--concurrency", "2", "--async")])
def test_a_second_signal_hands_running_jobs_back_at_once(
        redis_url: str, queue_name: str, r: redis.Redis,
        consumers: Callable[..., Consumer], mode: tuple[str, ...]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    running = int(mode[1])
    ids = q.add_many([("x", {"sleep": 120}, {"job_id": f"j{i}"}) for i in range(running)])
    a = consumers(redis_url, queue_name, *mode)  # the default drain timeout: 25 s
    wait_until(lambda: len(_started(r, queue_name)) == running, 30, "the jobs to start")
    a.proc.send_signal(signal.SIGINT)
    wait_until(lambda: any("SIGINT: stopping" in line for line in a.lines), 15,
               "the first signal to be taken")
    t0 = time.monotonic()
    a.proc.send_signal(signal.SIGINT)
    assert a.wait(20) == 0, a.output()
    assert time.monotonic() - t0 < 15, a.output()
    for job_id in ids:
        job = q.get(job_id)
        assert job is not None and job.state == "waiting", job
        assert job.stalls == 1 and job.attempts == 1, job


def test_a_second_signal_after_the_handler_returned_lets_its_job_complete(
        redis_url: str, queue_name: str, r: redis.Redis,
        consumers: Callable[..., Consumer]) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"linger": True})
    a = consumers(redis_url, queue_name).ready()  # sync, concurrency 1: the job in run()'s thread
    # the moment: the handler has returned; the runner is encoding its result
    wait_until(lambda: r.llen(f"ledger:{queue_name}:returned") == 1, 30, "the handler's return")
    a.proc.send_signal(signal.SIGINT)
    wait_until(lambda: any("SIGINT: stopping" in line for line in a.lines), 15,
               "the first signal to be taken")
    a.proc.send_signal(signal.SIGINT)
    wait_until(lambda: any("SIGINT again" in line for line in a.lines), 15,
               "the second signal to be taken")
    r.rpush(f"ledger:{queue_name}:go", "1")
    assert a.wait(20) == 0, a.output()
    job = q.get(job_id)
    # its handler had returned: the job is done, neither cut off nor charged a stall
    assert job is not None and job.state == "completed", (job, a.output())
    assert job.stalls == 0 and job.attempts == 1, job
    assert len(_started(r, queue_name)) == 1


BEFORE_HANDLER = """
import sys, time
from collections.abc import Mapping
import redis
import echomq

url, queue = sys.argv[1], sys.argv[2]
ledger = redis.Redis.from_url(url)


class Handlers(Mapping):
    running = False

    # the runner looks the handler up after the job counts as running: here it waits
    def __getitem__(self, name):
        if self.running:
            ledger.rpush(f"ledger:{queue}:lookup", "1")
            ledger.blpop([f"ledger:{queue}:go"])
        return lambda job: time.sleep(120)

    def __iter__(self):
        return iter(["x"])

    def __len__(self):
        return 1


handlers = Handlers()
consumer = echomq.Consumer(queue, handlers, redis_url=url, drain_timeout=1.0)
handlers.running = True
print("ready", flush=True)
print(f"ran {consumer.run()}", flush=True)
"""


def test_the_drain_timeout_cuts_a_job_whose_handler_had_not_started_yet(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None)
    proc = subprocess.Popen([sys.executable, "-c", BEFORE_HANDLER, redis_url, queue_name],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout or []:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # the moment: the job counts as running, its handler not called yet
        wait_until(lambda: r.llen(f"ledger:{queue_name}:lookup") == 1, 30, "the lookup")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: any("drain timeout" in line for line in lines), 15,
                   f"the drain timeout: {lines}")
        r.rpush(f"ledger:{queue_name}:go", "1")  # the handler would now sleep 120 s
        assert proc.wait(20) == 0, "".join(lines)
        job = q.get(job_id)
        assert job is not None and job.state == "waiting" and job.stalls == 1, job
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_stop_while_the_server_is_down_settles_the_finished_job_once_it_is_back(
        redis_url: str, queue_name: str, r: redis.Redis, tmp_path: Path,
        consumers: Callable[..., Consumer]) -> None:
    """The job finishes while the server is down (SIGKILLed: it comes back on its
    append-only file), its settle fails, and a SIGINT comes while the consumer waits for
    the server: once the server is back, the consumer settles it, then exits."""
    if server_binary() is None:
        pytest.skip("needs a redis-server/valkey-server binary")
    server = LocalRedis(appendonly=True, workdir=str(tmp_path),
                        extra_args=("--appendfsync", "always")).start()
    try:
        q = echomq.Queue(queue_name, redis_url=server.url)
        q.add("x", {"sleep": 1.5}, job_id="j0")
        q.close()
        a = consumers(server.url, queue_name, "--lease-ms", "5000", "--ledger-url", redis_url)
        wait_until(lambda: len(_started(r, queue_name)) == 1, 30, "the job to start")
        server.kill()
        wait_until(lambda: r.lrange(f"ledger:{queue_name}:done", 0, -1) == [b"j0"], 30,
                   "the job to finish")
        wait_until(lambda: "server unreachable" in a.output(), 30, "the failed settle")
        a.proc.send_signal(signal.SIGINT)
        wait_until(lambda: "SIGINT: stopping" in a.output(), 30, "the stop")
        server.start()
        assert a.wait(30) == 0, a.output()
        q = echomq.Queue(queue_name, redis_url=server.url)
        job = q.get("j0")
        # settled by the consumer that ran it: not left to lapse, charged, and run again
        assert job is not None and job.state == "completed", (job, a.output())
        assert job.attempts == 1 and job.stalls == 0, job
        assert _started(r, queue_name) == [("j0", a.proc.pid, 1)]
        q.close()
    finally:
        server.stop()
