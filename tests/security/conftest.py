"""Fixtures for access tests: certificates, a TLS-only server, a supervisor subprocess."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from echomq.supervisor.drills.localredis import LocalRedis, free_port

from .certs import Certs, make_certs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HANDLERS = ROOT / "tests" / "supervisor"  # sup_jobs: handlers that record into a ledger


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_server(certs: Certs, *, client_certs: str = "no") -> LocalRedis:
    """Debian's redis-server (built with TLS) listening on a TLS port only."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("the TLS tests need Debian's redis-server (apt-get install redis-server)")
    port = free_port()
    server = LocalRedis(port, extra_args=(
        "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
        "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", client_certs))
    server.binary = binary
    return server.start()


@pytest.fixture(scope="module")
def tls_redis(certs: Certs) -> Iterator[LocalRedis]:
    server = tls_server(certs)
    yield server
    server.stop()


class Proc:
    """An ``echomq-supervisor`` subprocess with its output lines collected."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        full_env = {**os.environ, "PYTHONPATH": f"{HANDLERS}{os.pathsep}{ROOT}", **env}
        self.proc = subprocess.Popen([sys.executable, "-m", "echomq.supervisor.cli", *args],
                                     env=full_env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    raise AssertionError(f"no {text!r} in output:\n" + "\n".join(self.lines))
                self.cond.wait(left)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.reader.join(5)
        return int(self.proc.returncode)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def run_supervisor() -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(list(args), env or {})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.05)
