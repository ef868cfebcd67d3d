"""A hung PostgreSQL floor never freezes the supervisor: its loop keeps serving /livez
and running jobs while the scheduler's floor call waits, and folding resumes after."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import free_port

import echomq

from .conftest import CLI, ROOT, Supervisor, wait_until

Start = Callable[..., Supervisor]
LIVE_AFTER_S = 10.0  # the supervisor's /livez limit for a 100 ms beat (cli.py)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _folded(base: str, queue: str) -> int:
    _code, text = _get(base + "/metrics")
    match = re.search(rf'^echomq_floor_folded_total{{queue="{queue}"}} (\S+)$', text, re.M)
    return int(float(match.group(1))) if match else -1


def test_a_paused_postgres_backend_does_not_stop_the_supervisor(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis,
        pg_admin: sa.Engine, throwaway_database: Callable[[str], str]) -> None:
    floor_url = throwaway_database("emq_hung")
    database = sa.make_url(floor_url).database
    subprocess.run([*CLI, "migrate", "--floor-url", floor_url], check=True, cwd=ROOT,
                   capture_output=True, timeout=60)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    supervisor(redis_url, queue_name, "--processes", "1", "--floor-url", floor_url,
               "--beat-ms", "100", "--health-port", str(port)).started(1)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", {}, delay=3600)
    wait_until(lambda: _folded(base, queue_name) >= 1, 15, "the first fold")

    # Every backend serving the supervisor's floor stops answering: the kernel still
    # acknowledges its packets, so no TCP timeout fires, and the server-side statement
    # and lock timeouts cannot fire either. Only staying off the loop helps.
    def stop_new_backends() -> None:
        """SIGSTOP every backend of the floor's database not stopped yet: a connection the
        supervisor opens later must hang as well, as it would on a hung server."""
        with pg_admin.connect() as conn:
            found = [row[0] for row in conn.exec_driver_sql(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,))]
        for pid in found:
            if pid not in pids:
                os.kill(pid, signal.SIGSTOP)
                pids.append(pid)

    pids: list[int] = []
    stop_new_backends()
    assert pids, "the supervisor holds no floor connection"
    try:
        folded = _folded(base, queue_name)
        q.add("x", {}, delay=3600)  # the next fold waits on a stopped backend
        window_end = time.monotonic() + LIVE_AFTER_S + 3
        ids: list[str] = []
        pause = threading.Event()
        while time.monotonic() < window_end:  # the assertion is "for this whole window"
            code, body = _get(base + "/livez")
            assert code == 200, body
            ids.append(q.add("x", {}))
            ids.append(q.add("x", {}, delay=0.2))  # promoted by the loop, not the floor
            stop_new_backends()
            pause.wait(0.5)
        done = {x.decode() for x in r.lrange(f"ledger:{queue_name}:done", 0, -1)}
        wait_until(lambda: set(ids) <= {x.decode() for x in
                                        r.lrange(f"ledger:{queue_name}:done", 0, -1)},
                   15, "every job added during the hang")
        assert len(done & set(ids)) >= len(ids) // 2, "jobs stopped flowing during the hang"
        assert _folded(base, queue_name) == folded, "the floor answered: nothing was hung"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    wait_until(lambda: _folded(base, queue_name) > folded, 30, "folding to resume")
