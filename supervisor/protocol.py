"""What parent and child say over their socketpair: short ASCII lines.

child → parent
    ``READY`` / ``READY park``      the handler is loaded; the child counts as idle (with
                                    ``park``: it can park on the doorbell itself, see B)
    ``RUNG w``                      its parked call took a ring: it claims now (busy), and
                                    the doorbell is the parent's again
    ``RUNG d <due_ms>``             its parked call took a marker announcing a schedule head
                                    due then (server ms); it stays parked
    ``UNPARKED``                    its parked call failed (its connection); the doorbell is
                                    the parent's again, the child idle
    ``PARKED``                      its parked call's block ran out and it parked again: alive
                                    (a holder silent for two blocks is taken the doorbell from)
    ``IDLE <n> <claim_to_start_us>``  a claim came back empty; the child waits for a poke.
                                    n jobs ran since the last report, with the summed wait
                                    between their claim and their start
    ``OBS <json>``                  folded job observations for /metrics (observations.py)
    ``REFUSED <code> <text>``       the server refused a write (OOM, READONLY, ...); the
                                    child keeps its unsettled outcomes and waits for a poke
    ``BOOTFAIL <text>``             the child could not start (before READY); respawning
                                    would not help. Its exit code says nothing: a handler
                                    may exit with any code
parent → child
    ``P``   poke: claim until empty
    ``S``   stop when the jobs in hand are done and settled
    ``C``   a job it holds was cancelled: cancel the coroutines (and drop the unstarted
            jobs) whose tokens went stale
    ``B``   the queue's doorbell is yours: park on it beside the pipe (one blocking call
            per queue still: the parent does not park while a child does), claim at its
            ring. Any other message ends the park (the child cancels its call, putting
            back what it took); a poke or a stop beside a ``B`` wins over it

Which jobs a child holds, and which of them run, is not said here: the child
keeps it in shared memory (:mod:`echomq.supervisor.holdings`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

POKE = b"P"
STOP = b"S"
CANCEL = b"C"
BELL = b"B"
READY = "READY"
PARKS = "park"  # READY's word for a child that can park on the doorbell
RUNG = "RUNG"
UNPARKED = "UNPARKED"
PARKED = "PARKED"
IDLE = "IDLE"
OBS = "OBS"
REFUSED = "REFUSED"
BOOTFAIL = "BOOTFAIL"

# exit codes the parent reads from waitpid
EXIT_OK = 0
EXIT_BOOT_FAILED = 3  # the supervisor's exit when a consumer could not boot (BOOTFAIL)
EXIT_RECYCLE = 4  # max jobs or memory reached: respawn at once, this was not a crash


def idle_line(jobs: int, wait_us: int) -> bytes:
    """The child's IDLE report: jobs run and wait time since the last one."""
    return f"{IDLE} {jobs} {wait_us}\n".encode()


def rung_line(due_ms: float | None = None) -> bytes:
    """The parked child's report of a ring (it claims now), or of a schedule head's due."""
    return f"{RUNG} w\n".encode() if due_ms is None else f"{RUNG} d {due_ms:.0f}\n".encode()


def refused_line(code: str, text: str) -> bytes:
    """The child's REFUSED report: the server's error code and text, one line."""
    return f"{REFUSED} {code} {_one_line(text)}\n".encode("ascii", "replace")


def bootfail_line(text: str) -> bytes:
    """The child's BOOTFAIL report: why it could not start, one line."""
    return f"{BOOTFAIL} {_one_line(text)}\n".encode("ascii", "replace")


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


class LineReader:
    """Splits what a non-blocking socket delivers into lines; EOF shows as ``closed``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def read(self) -> Iterator[str]:
        """The complete lines readable now (non-blocking); none yet, or EOF, ends it."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            yield line.decode("ascii", "replace")
