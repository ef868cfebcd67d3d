"""Settle a batch's finished outcomes while a long job of the same batch runs.

A batch's outcomes are settled together after its last job, with the next
claim. When a job with a time limit runs long, its process may be ended at
that limit (a sync handler cannot be interrupted inside its process), and
the outcomes of the jobs that finished before it would go with it: those
jobs would run a second time. So once such a job has run for half its limit,
a thread of the drain's settles them meanwhile. A job that ends sooner costs
a lock and a notify, no round trip.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled

log = logging.getLogger("echomq.drain")


class EarlySettle:
    """One settler thread per drain, started at the first long job that needs it."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes
        self.cond = threading.Condition()
        self.due: float | None = None  # monotonic time to settle ``outcomes`` at
        self.outcomes: list[Outcome] = []
        self.busy = False
        self.result: tuple[list[Outcome], list[Settled]] | None = None
        self.thread: threading.Thread | None = None

    def arm(self, outcomes: Sequence[Outcome], after_s: float) -> None:
        """Settle ``outcomes`` in ``after_s`` seconds unless :meth:`disarm` comes first."""
        with self.cond:
            self.due = time.monotonic() + after_s
            self.outcomes = list(outcomes)
            self.result = None
            self.cond.notify()
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="echomq-settle",
                                           daemon=True)
            self.thread.start()

    def disarm(self) -> tuple[list[Outcome], list[Settled]] | None:
        """Cancel a settle not begun, wait for one under way; returns what it settled
        (the outcomes and their codes), or None when nothing was."""
        with self.cond:
            self.due = None
            while self.busy:
                self.cond.wait()
            result, self.result = self.result, None
            return result

    def _loop(self) -> None:
        with self.cond:
            while True:
                if self.due is None:
                    self.cond.wait()
                    continue
                left = self.due - time.monotonic()
                if left > 0:
                    self.cond.wait(left)  # a disarm or a new arm wakes it sooner
                    continue
                outcomes, self.due, self.busy = self.outcomes, None, True
                self.cond.release()
                try:
                    codes = self.lanes.settle(outcomes)
                except Exception as exc:  # kept: they settle with the batch, as usual
                    log.warning("queue %s: could not settle %d outcome(s) early: %s",
                                self.lanes.keys.queue, len(outcomes), exc)
                    codes = None
                finally:
                    self.cond.acquire()
                self.busy = False
                if codes is not None:
                    self.result = (outcomes, codes)
                self.cond.notify_all()
