"""The drills' job handler: every execution is recorded in a SQLite ledger outside the queue.

The ledger is the drills' ground truth. Lost and duplicated jobs are counted
from it, never from the queue's own counters, because those counters live in
the very server the drills kill. A row is written only after the job's work is
done: a process killed mid-job leaves no ``ok`` row, so an ``ok`` row means the
job's effect happened, and two ``ok`` rows for one job mean it happened twice.

Environment (set by ``echomq-supervisor drill`` on the supervisor it starts):

``ECHOMQ_DRILL_LEDGER``  path of the ledger (required)
``ECHOMQ_DRILL_NOTIFY``  optional path of a unix datagram socket; one byte is sent
                         after each ``ok`` row so the drill wakes instead of polling

Payload keys: ``work_ms`` (simulated work, default 5) and ``fail_first`` (raise on
attempt 1, so the job goes through a retry). For the randomized fault test also:
``trace`` (record a ``start`` row before the work, so a run that never ended shows),
``fail_always`` (raise on every attempt), ``exit_first`` / ``exit_always`` (an exit
code: the process leaves with ``os._exit`` mid-job on attempt 1 / on every attempt).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from typing import Any

LEDGER_ENV = "ECHOMQ_DRILL_LEDGER"
NOTIFY_ENV = "ECHOMQ_DRILL_NOTIFY"
BUSY_TIMEOUT_MS = 30_000  # several consumers append at once; none may give up

SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    job_id  TEXT    NOT NULL,
    attempt INTEGER NOT NULL,
    pid     INTEGER NOT NULL,
    kind    TEXT    NOT NULL,   -- 'ok' (the job's work is done), 'fail' (attempt raised),
                                -- 'start' (a traced run began)
    at      REAL    NOT NULL    -- time.time() of the record
)
"""


class DrillFailure(Exception):
    """The planned failure of a ``fail_first`` job's first attempt."""


def open_ledger(path: str) -> sqlite3.Connection:
    """An autocommit connection in WAL mode with a generous busy timeout; creates the table."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(SCHEMA)
    return conn


class _PerProcess:
    """The ledger connection and notify socket of this process.

    Opened lazily and re-opened when ``os.getpid()`` changes: the supervisor
    imports this module before it forks, and a SQLite connection must never be
    shared across a fork.
    """

    def __init__(self) -> None:
        self.pid = -1
        self.path = ""
        self.conn: sqlite3.Connection | None = None
        self.sock: socket.socket | None = None
        self.notify_path: str | None = None
        self.inherited: list[sqlite3.Connection] = []

    def ensure(self) -> sqlite3.Connection:
        pid, path = os.getpid(), os.environ.get(LEDGER_ENV, "")
        if not path:
            raise RuntimeError(f"{LEDGER_ENV} is not set: the drill handler needs a ledger")
        if self.conn is None or self.pid != pid or self.path != path:
            if self.conn is not None and self.pid != pid:
                # inherited across a fork: keep it referenced so it is never closed (or
                # checkpointed) from this process; only its owner may do that
                self.inherited.append(self.conn)
            self.conn = open_ledger(path)
            self.notify_path = os.environ.get(NOTIFY_ENV) or None
            self.sock = None
            if self.notify_path:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.sock.setblocking(False)
            self.pid, self.path = pid, path
        return self.conn

    def record(self, job: Any, kind: str) -> None:
        conn = self.ensure()
        conn.execute("INSERT INTO executions (job_id, attempt, pid, kind, at) "
                     "VALUES (?, ?, ?, ?, ?)", (job.id, job.attempts, self.pid, kind, time.time()))
        if kind == "ok" and self.sock is not None and self.notify_path:
            try:
                self.sock.sendto(b"1", self.notify_path)
            except OSError:
                pass  # a full or missing doorbell: the drill re-reads the ledger on its beat


_state = _PerProcess()


def handle(job: Any) -> dict[str, Any]:
    """Do a little work, fail attempt 1 when asked to, and record the execution."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if payload.get("trace"):
        _state.record(job, "start")
    work_ms = float(payload.get("work_ms", 5))
    if work_ms > 0:
        time.sleep(work_ms / 1000)  # the job's simulated work
    exit_code = payload.get("exit_always")
    if exit_code is None and job.attempts <= 1:
        exit_code = payload.get("exit_first")
    if exit_code is not None:
        os._exit(int(exit_code))  # a handler that takes its process down mid-job
    if payload.get("fail_always"):
        _state.record(job, "fail")
        raise DrillFailure(f"job {job.id}: planned failure of every attempt")
    if payload.get("fail_first") and job.attempts <= 1:
        _state.record(job, "fail")
        raise DrillFailure(f"job {job.id}: planned failure of attempt {job.attempts}")
    _state.record(job, "ok")
    return {"pid": os.getpid()}
