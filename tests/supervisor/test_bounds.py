"""Bounded work per turn of the supervisor's loop, and a health server that bounds its
connections and their time."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import redis
from echomq.supervisor.health import Health
from echomq.supervisor.localredis import free_port
from echomq.supervisor.metronome import Metronome

import echomq
from echomq.config import QueueSettings

from .conftest import CLI, ROOT, wait_until


def test_promote_of_a_large_due_backlog_yields_to_the_loop_between_slices(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", {"i": i}, {"delay": 0.001}) for i in range(3000)])
    wait_until(lambda: r.zcount(q.keys.schedule, "-inf", int(r.time()[0]) * 1000) == 3000, 5,
               "every job to fall due")
    metronome = Metronome(queue_name, r, QueueSettings(pump_batch=10))
    now = time.monotonic()
    assert metronome.pump(now, disarmed=True)
    first = metronome.promoted
    assert 0 < first < 3000, "one turn promoted the whole backlog"
    assert metronome.deadline() <= now  # comes back on the next turn, not a beat later
    turns = 1
    while metronome.promoted < 3000:
        metronome.pump(time.monotonic(), disarmed=True)
        turns += 1
        assert turns < 1000
    assert q.counts()["waiting"] == 3000 and q.counts()["scheduled"] == 0


def _health(redis_url: str, **kw: object) -> Health:
    snap = {"last_loop": time.monotonic(), "stopping": False, "queues": {}}
    return Health("127.0.0.1", free_port(), redis_url, lambda: snap, 10.0, **kw)  # type: ignore[arg-type]


def test_half_sent_requests_do_not_hold_health_threads_forever(redis_url: str) -> None:
    health = _health(redis_url, request_timeout_s=0.5, max_connections=4)
    health.start()
    try:
        stalled = []
        for _ in range(20):  # each sends half a request line and then nothing
            s = socket.create_connection(("127.0.0.1", health.port))
            s.sendall(b"GET /liv")
            stalled.append(s)
        wait_until(lambda: health.open_connections() == 4, 5, "the stalled requests")
        # a probe still gets its answer: each stalled one is dropped after its timeout
        with urllib.request.urlopen(f"http://127.0.0.1:{health.port}/livez", timeout=30) as resp:
            assert resp.status == 200
        assert health.most_connections <= 4
        wait_until(lambda: health.open_connections() == 0, 10, "stalled requests to time out")
        for s in stalled:
            s.close()
    finally:
        health.stop()


def test_start_does_not_let_the_working_directory_shadow_installed_modules(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    installed, cwd = tmp_path / "site", tmp_path / "cwd"
    installed.mkdir()
    cwd.mkdir()
    (installed / "emq_shadowed.py").write_text("def run(job):\n    return 'installed'\n")
    (cwd / "emq_shadowed.py").write_text("raise ImportError('the copy in the working directory')\n")
    env = {**os.environ, "PYTHONPATH": f"{installed}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen([*CLI, "start", "--redis-url", redis_url, "--queue", queue_name,
                             "--handler", "emq_shadowed:run"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        q = echomq.Queue(queue_name, redis_url=redis_url)
        job_id = q.add("x", {})
        wait_until(lambda: proc.poll() is not None
                   or getattr(q.get(job_id), "state", "") == "completed", 20, "the job")
        assert proc.poll() is None, proc.communicate()[0]
        assert q.get(job_id).result == "installed"  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(30)
