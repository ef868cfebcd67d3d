"""A real Valkey Cluster (3 masters, 3 replicas on 127.0.0.1) and a supervisor serving
queues spread over every master.

The session's cluster is shared by the tests that leave it whole; a test that kills
a node starts its own. Ledgers of what ran live on the session's plain server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from echomq.supervisor.drills.localcluster import LocalCluster, cli_binary
from redis.cluster import RedisCluster

from echomq.connection import connect, slot_of

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
START_TIMEOUT_S = 60.0


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Re-check a condition until it holds; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


def start_cluster() -> LocalCluster:
    if cli_binary() is None:
        pytest.skip("no valkey-cli/redis-cli to create a cluster with")
    cluster = LocalCluster(3, 1)
    try:
        return cluster.start(timeout=START_TIMEOUT_S)
    except BaseException:
        cluster.stop()
        raise


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    c = start_cluster()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def rc(cluster: LocalCluster) -> Iterator[RedisCluster]:
    client = connect(cluster.url)
    assert isinstance(client, RedisCluster)
    yield client
    client.close()


def spread_queues(client: RedisCluster, count: int) -> list[str]:
    """``count`` fresh queue names whose slots fall on every master, in turn."""
    masters = sorted(n.name for n in client.get_primaries())
    by_master: dict[str, list[str]] = {m: [] for m in masters}
    run = uuid.uuid4().hex[:6]
    i = 0
    while sum(len(v) for v in by_master.values()) < count:
        name = f"cl-{run}-{i}"
        i += 1
        owner = client.get_node_from_key(f"emq:{{{name}}}:wake").name
        want = masters[sum(len(v) for v in by_master.values()) % len(masters)]
        if owner == want:
            by_master[owner].append(name)
    names = [n for group in by_master.values() for n in group]
    return sorted(names, key=lambda n: slot_of(f"{{{n}}}"))


class Supervisor:
    """``echomq-supervisor start`` over a config file of queues, its log collected."""

    def __init__(self, redis_url: str, queues: list[str], ledger_url: str, tmp: Path,
                 *args: str, processes: int = 1, env: dict[str, str] | None = None,
                 handler: str = "cluster_jobs:record") -> None:
        config = tmp / f"queues-{uuid.uuid4().hex[:6]}.json"
        config.write_text(json.dumps({"queues": [
            {"name": q, "handler": handler, "processes": processes}
            for q in queues]}))
        full_env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
                    "ECHOMQ_TEST_LEDGER_URL": ledger_url, **(env or {})}
        cmd = [sys.executable, "-m", "echomq.supervisor.cli", "start", "--redis-url",
               redis_url, "--config", str(config), *args]
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(cmd, env=full_env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for_log(self, pattern: str, count: int = 1, timeout: float = 60.0) -> None:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while sum(1 for line in self.lines if rx.search(line)) < count:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no {count}x {pattern!r} in log:\n" +
                                         "\n".join(self.lines[-40:]))
                self.cond.wait(min(left, 1.0))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def supervisor(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """Start supervisors (ledger on the session's plain server); all stopped at the end."""
    started: list[Supervisor] = []

    def start(url: str, queues: list[str], *args: str, **kw: object) -> Supervisor:
        sup = Supervisor(url, queues, redis_url, tmp_path, *args, **kw)  # type: ignore[arg-type]
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.stop()
