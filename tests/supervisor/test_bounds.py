"""Bounded work per turn of the supervisor's loop, and a health server that bounds its
connections and their time."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import redis
from echomq.supervisor.drills.localredis import LocalRedis, free_port
from echomq.supervisor.health import Health
from echomq.supervisor.metronome import Metronome

import echomq
from echomq.config import QueueSettings

from .conftest import CLI, ROOT, Supervisor, wait_until

Start = Callable[..., Supervisor]


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


def _calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_metrics_scrape_does_not_walk_every_lane(private_redis: LocalRedis) -> None:
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("wide", redis=client)
    q.add_many([("x", {}, {"lane": f"lane-{i}"}) for i in range(2000)])
    snap = {"last_loop": time.monotonic(), "stopping": False, "queues": {"wide": {
        "children": 0, "busy": 0, "restarts": 0, "claim_wait_us": 0, "claim_jobs": 0,
        "rings": 0, "promoted": 0, "reaped": 0, "pids": [], "scheduler": None}}}
    health = Health("127.0.0.1", free_port(), private_redis.url, lambda: snap, 10.0)
    before = _calls(client, "llen")
    text = health.metrics().decode()
    assert _calls(client, "llen") - before < 10, "a scrape ran LLEN per lane"
    assert 'echomq_queue_jobs{queue="wide",state="waiting"} 2000.0' in text
    health.stop()


def test_kept_waiting_counter_agrees_with_the_lanes(redis_url: str, queue_name: str) -> None:
    from echomq import scripts
    from echomq.lanes import Lanes, Outcome

    q = echomq.Queue(queue_name, redis_url=redis_url, max_attempts=1)
    q.add_many([("x", {}, {"lane": f"l{i % 7}"}) for i in range(100)])
    q.add_many([("d", {}, {"delay": 0.001}) for _ in range(30)])
    q.add("dup", {}, job_id="dup")
    q.add("dup", {}, job_id="dup")
    lanes = Lanes(q.redis, q.keys, q.settings)
    claimed = lanes.claim(40)
    lanes.settle([Outcome(c.id, c.token, "f", "boom") for c in claimed[:10]])
    lanes.release([(c.id, c.token) for c in claimed[10:20]], "stall")
    lanes.release([(c.id, c.token) for c in claimed[20:25]], "unstarted")
    q.redis.delete(q.keys.job(q.redis.lindex(q.keys.lane("l3"), 0).decode()))  # a torn id
    wait_until(lambda: scripts.promote(q.redis, q.keys, 100)[0] == 0
               and q.redis.zcard(q.keys.schedule) == 0, 5, "the deferred jobs to promote")
    q.retry_dead()
    lanes.claim(16)
    exact = scripts.counts(q.redis, q.keys)
    assert scripts.counts(q.redis, q.keys, fast=True) == exact
    assert exact[0] > 0


def test_dead_jobs_are_trimmed_to_the_retention(redis_url: str, queue_name: str) -> None:
    from echomq.lanes import Lanes, Outcome

    q = echomq.Queue(queue_name, redis_url=redis_url, keep_dead=5, keep_dead_s=None)
    ids = q.add_many([("x", {"blob": "x" * 1000}) for _ in range(20)])
    lanes = Lanes(q.redis, q.keys, q.settings)
    def server_ms() -> int:
        sec, us = q.redis.time()
        return int(sec) * 1000 + int(us) // 1000

    for _ in range(2):  # the first ten die a few ms before the others
        batch = lanes.claim(10)
        lanes.settle([Outcome(c.id, c.token, "d", "bad input") for c in batch])
        died = max(int(q.redis.hget(q.keys.job(c.id), "finished_ms")) for c in batch)
        wait_until(lambda d=died: server_ms() > d + 2, 5, "the server clock to move on")
    metronome = Metronome(queue_name, q.redis, q.settings)
    metronome.pump(time.monotonic(), disarmed=True)
    kept = [j.id for j in q.dead()]
    assert len(kept) == 5 and set(kept) <= set(ids[10:])
    assert sum(q.redis.exists(q.keys.job(i)) for i in ids) == 5  # hashes dropped too
    assert metronome.dead_trimmed == 15
    aged = echomq.Queue(queue_name, redis_url=redis_url, keep_dead=None, keep_dead_s=0)
    Metronome(queue_name, q.redis, aged.settings).pump(time.monotonic(), disarmed=True)
    assert q.counts()["dead"] == 0


def test_add_many_bounds_the_bytes_of_one_script_call(private_redis: LocalRedis) -> None:
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("big", redis=client, admit_call_bytes=4 * 1024 * 1024)
    before = _calls(client, "evalsha")
    ids = q.add_many([("x", "y" * 512 * 1000) for _ in range(40)]
                     + [("d", "z" * 512 * 1000, {"delay": 60}) for _ in range(10)])
    calls = _calls(client, "evalsha") - before
    assert calls >= 5 + 2, f"20 MB + 5 MB admitted in {calls} script call(s)"
    assert q.counts()["waiting"] == 40 and q.counts()["scheduled"] == 10 and len(set(ids)) == 50


def test_supervisor_trims_dead_jobs_to_keep_dead(
        supervisor: Start, redis_url: str, queue_name: str) -> None:
    from echomq.lanes import Lanes, Outcome

    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", {}) for _ in range(10)])
    lanes = Lanes(q.redis, q.keys, q.settings)
    lanes.settle([Outcome(c.id, c.token, "d", "bad input") for c in lanes.claim(10)])
    assert q.counts()["dead"] == 10
    supervisor(redis_url, queue_name, "--processes", "1", "--keep-dead", "3").started(1)
    wait_until(lambda: q.counts()["dead"] == 3, 15, "the dead set trimmed to 3")
