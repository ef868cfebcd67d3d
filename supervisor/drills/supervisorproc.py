"""One ``echomq-supervisor start`` subprocess of a drill: its log lines pumped to a file
and counted by event name as they come, its start, children, signals and exit; and
waiting for processes to be gone."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

START_TIMEOUT_S = 20.0


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait for processes that are not our children to exit (pidfd: an event, not a poll).
    Returns the pids still alive at the deadline."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    try:
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                os.close(fd)
                fds.pop(fd)
        return list(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


class SupervisorProc:
    """One ``echomq-supervisor start`` subprocess; its JSON log lines are pumped to a file
    and counted by event name as they arrive."""

    def __init__(self, index: int, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.index = index
        self.log_path = log_path
        self.started = threading.Event()
        self.events: Counter[str] = Counter()
        self.logged = threading.Condition()  # notified as each event line is counted
        self.crashes = 0
        self.late_beats: list[tuple[float, float]] = []  # (from, to) of each late beat
        self.signalled: str | None = None  # set when the drill itself signals it
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.pump = threading.Thread(target=self._pump, name=f"drill-sup{index}-log",
                                     daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        with open(self.log_path, "ab") as out:
            for raw in iter(self.proc.stderr.readline, b""):
                out.write(raw)
                self._count(raw)
        self.started.set()  # a supervisor that died before starting must not hang a waiter

    def _count(self, raw: bytes) -> None:
        try:
            line = json.loads(raw)
        except ValueError:
            return  # a traceback line; it is in the log file
        name = line.get("event") if isinstance(line, dict) else None
        if not name:
            return
        with self.logged:
            self.events[name] += 1
            self.logged.notify_all()
        if name == "child-exit" and line.get("level") == "warning":
            self.crashes += 1
        if name == "scheduler-late" and "since" in line and "gap_s" in line:
            self.late_beats.append((line["since"], line["since"] + line["gap_s"]))
        if name == "start":
            self.started.set()

    def wait_event(self, name: str, seen: int, timeout: float) -> bool:
        """Wait until the supervisor logged event ``name`` more than ``seen`` times."""
        with self.logged:
            return self.logged.wait_for(lambda: self.events[name] > seen, timeout)

    def wait_started(self, timeout: float = START_TIMEOUT_S) -> bool:
        """Wait until the supervisor logged its start; False if it did not or exited."""
        return self.started.wait(timeout) and self.proc.poll() is None

    def children(self) -> list[int]:
        """Pids of the supervisor's live child processes."""
        try:
            return [c.pid for c in psutil.Process(self.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def terminate(self) -> None:
        """Send SIGTERM (a graceful drain) and note it."""
        self.signalled = "SIGTERM"
        self._signal(signal.SIGTERM)

    def kill_tree(self) -> list[int]:
        """SIGKILL the supervisor and its consumers; returns the consumer pids killed."""
        self.signalled = "SIGKILL"
        self._signal(signal.SIGSTOP)  # freeze it so no consumer is forked while we list them
        kids = self.children()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        wait_gone(kids, 10.0)
        return kids

    def wait(self, timeout: float) -> int | None:
        """Wait for the process to exit; its exit code, or None at the timeout."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def _signal(self, sig: int) -> None:
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def finish(self) -> None:
        """Make sure the process is gone and its log reader has stopped."""
        if self.proc.poll() is None:
            self.kill_tree()
        self.pump.join(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
