"""A real supervisor subprocess under test, with its log lines collected as they come."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CLI = [sys.executable, "-m", "echomq.supervisor.cli"]


def readyz(base: str) -> dict[str, Any]:
    """The health port's /readyz body at ``base`` (http://host:port), ready or not."""
    try:
        with urllib.request.urlopen(base + "/readyz", timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())  # type: ignore[no-any-return]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Re-check a condition until it holds; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


class Supervisor:
    def __init__(self, redis_url: str, queue: str, *args: str,
                 env: dict[str, str] | None = None, flags: bool = True,
                 cwd: Path | None = None) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        full_env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
                    "ECHOMQ_TEST_LEDGER_URL": redis_url, **(env or {})}
        cmd = [*CLI, "start"]
        if flags:
            cmd += ["--redis-url", redis_url, "--queue", queue]
            if "--handler" not in args:
                cmd += ["--handler", "sup_jobs:record"]
        cmd += list(args)
        self.proc = subprocess.Popen(cmd, env=full_env, cwd=cwd or ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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

    def wait_for_log(self, pattern: str, count: int = 1, timeout: float = 15.0) -> list[str]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                hits = [line for line in self.lines if rx.search(line)]
                if len(hits) >= count:
                    return hits
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    raise AssertionError(f"no {count}× {pattern!r} in log:\n" +
                                         "\n".join(self.lines[-40:]))
                self.cond.wait(left)

    def started(self, processes: int) -> Supervisor:
        self.wait_for_log(r"consumer \d+ started", processes)
        return self

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the supervisor did not exit within {timeout}s; its log, "
                                 f"then every thread's stack:\n{self.stacks()}") from None
        self.reader.join(5)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def stacks(self) -> str:
        """The log's tail after SIGUSR2 to the supervisor and its consumers: each prints
        every thread's stack (supervisor/signals.py), for a failure to show where they
        wait."""
        import psutil

        pids = [self.proc.pid]
        try:
            pids += [c.pid for c in psutil.Process(self.proc.pid).children()]
        except psutil.NoSuchProcess:
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
        try:
            self.wait_for_log(r"^Current thread 0x", len(pids), timeout=5)
        except AssertionError:
            pass
        return "\n".join(self.lines[-300:])

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def supervisor() -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []

    def start(*args: str, **kwargs: object) -> Supervisor:
        sup = Supervisor(*args, **kwargs)  # type: ignore[arg-type]
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.stop()
