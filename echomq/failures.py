"""Failure logs: what a consumer says when a job it ran fails.

Each failed attempt is one WARNING on the ``echomq.jobs`` logger (job id, name, queue,
lane, attempt, the exception's one line); an attempt that leaves the job dead (its last
attempt, or ``Fail``) is one ERROR with the traceback instead. The process that ran the
job logs it, so under the supervisor the line carries that consumer's pid.

A flood of failures cannot flood the log: each process spends from a token bucket of
:data:`BURST` lines refilled at :data:`PER_S` a second. A failure the bucket refuses is
counted, not logged; the next failure logged is preceded by one line
``N failure logs suppressed``. Every failure is still on the job itself (its ``error``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from typing import Any

from echomq.control import Fail, Retry

LOGGER = logging.getLogger("echomq.jobs")
BURST = 20  # lines logged at once before the bucket runs dry
PER_S = 1.0  # lines a second after that, per process
ONE_LINE_CHARS = 300


class Bucket:
    """A token bucket: ``take()`` is True while tokens remain; they refill at ``per_s``."""

    def __init__(self, burst: int = BURST, per_s: float = PER_S) -> None:
        self.burst = burst
        self.per_s = per_s
        self.tokens = float(burst)
        self.at = time.monotonic()
        self.suppressed = 0
        self.lock = threading.Lock()

    def take(self) -> tuple[bool, int]:
        """(allowed, how many were refused since the last allowed one)."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s)
            self.at = now
            if self.tokens < 1:
                self.suppressed += 1
                return False, 0
            self.tokens -= 1
            refused, self.suppressed = self.suppressed, 0
            return True, refused


_bucket = Bucket()


def printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\udcff``), so any handler can write it: a
    strict UTF-8 log file, or a process that sends its log lines on as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, bounded (the type alone when its str() raises)."""
    try:
        text = str(exc).strip().splitlines()
    except Exception:  # noqa: BLE001 - a broken __str__: the line names the type
        text = []
    if text and isinstance(exc, (Retry, Fail)):  # their text names them already
        line = text[0]
    else:
        line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    line = printable(line)
    return line if len(line) <= ONE_LINE_CHARS else line[:ONE_LINE_CHARS - 1] + "…"


def note(queue: str, claimed: Any, exc: BaseException) -> None:
    """Log one failed attempt of ``claimed`` (an echomq.job.Claimed), within the bucket.
    Never raises: a line that cannot be made is not worth the job's failure."""
    try:
        _note(queue, claimed, exc)
    except Exception:  # noqa: BLE001 - the job's own error keeps its failure
        pass


def _note(queue: str, claimed: Any, exc: BaseException) -> None:
    if not LOGGER.isEnabledFor(logging.WARNING):
        return
    allowed, refused = _bucket.take()
    if not allowed:
        return
    if refused:
        LOGGER.warning("%d failure logs suppressed (at most %d at once, then %g a second)",
                       refused, BURST, PER_S,
                       extra={"event": "failures_suppressed", "queue": queue, "count": refused})
    dead = isinstance(exc, Fail) or claimed.attempts >= claimed.max_attempts
    fields = {"event": "job_dead" if dead else "job_failed", "queue": queue,
              "job_id": claimed.id, "job_name": claimed.name, "lane": claimed.lane,
              "attempt": claimed.attempts, "max_attempts": claimed.max_attempts,
              "pid": os.getpid()}
    where = printable(f"job {claimed.id} ({claimed.name}) on queue {queue} lane "
                      f"{claimed.lane}, attempt {claimed.attempts} of {claimed.max_attempts}")
    if dead:
        record = LOGGER.makeRecord(LOGGER.name, logging.ERROR, __file__, 0,
                                   "%s failed, dead: %s", (where, one_line(exc)),
                                   (type(exc), exc, exc.__traceback__), extra=fields)
        # the traceback as formatters show it (they keep exc_text), surrogates escaped
        record.exc_text = printable("".join(traceback.format_exception(exc)).rstrip("\n"))
        LOGGER.handle(record)
    else:
        LOGGER.warning("%s failed, will retry: %s", where, one_line(exc), extra=fields)


def _reset_after_fork() -> None:
    global _bucket
    _bucket = Bucket(_bucket.burst, _bucket.per_s)  # the parent's lock may be held


os.register_at_fork(after_in_child=_reset_after_fork)
