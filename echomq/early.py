"""Settle a batch's finished outcomes while the batch is still running.

A batch's outcomes are settled together after its last job, with the next
claim. When one job of a batch runs long, the jobs that finished before it
would wait for it: their results unread, their dependents blocked, and a
crash of its process (or its end at a time limit: a sync handler cannot be
interrupted inside its process) would run them a second time. So while a
batch runs, a thread of the drain's settles what has finished every
``drain.EARLY_SETTLE_S`` (sooner when a job of the batch has a time limit
under twice that). A batch that ends sooner costs two locks, no round trip
and no thread switch: between batches the thread keeps a timed wait (it wakes
once a period, not once a batch), and waits for an arm only after a whole
period without one (the drain is parked or gone).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from itertools import takewhile

from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled

log = logging.getLogger("echomq.drain")


class EarlySettle:
    """One settler thread per drain, started at the first batch that needs it."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes
        self.cond = threading.Condition(threading.Lock())
        self.due: float | None = None  # monotonic time of the next settle; None: disarmed
        self.every = 0.0
        self.wakes_at = math.inf  # when the thread's wait ends by itself
        self.outcomes: list[Outcome] = []  # the drain's list: it appends while armed
        self.settled = 0  # how many at the head of ``outcomes`` this thread settled
        self.codes: list[Settled] = []
        self.busy = False
        self.retries = True  # may settle retries ("f" outcomes) early
        self.rested = False  # disarmed at the thread's last wake, with no arm since
        self.thread: threading.Thread | None = None

    def arm(self, outcomes: list[Outcome], every_s: float, *, retries: bool = True) -> None:
        """Settle what ``outcomes`` holds every ``every_s`` seconds until :meth:`disarm`.
        The caller may append to it meanwhile, and removes nothing before the disarm. The
        thread is woken only when its wait would end too late. ``retries`` False: settle
        no further than the first retry (its owner writes retries through itself)."""
        with self.cond:
            self.due = time.monotonic() + every_s
            self.every = every_s
            self.retries = retries
            self.outcomes = outcomes
            self.settled = 0
            self.codes = []
            self.rested = False
            if self.due < self.wakes_at:
                self.cond.notify()
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="echomq-settle",
                                           daemon=True)
            self.thread.start()

    def disarm(self) -> tuple[int, list[Settled]]:
        """Settle no more, waiting for a settle under way; returns how many outcomes at
        the head of the list were settled, and their codes."""
        with self.cond:
            self.due = None
            while self.busy:
                self.cond.wait()
            done, codes = self.settled, self.codes
            self.outcomes, self.settled, self.codes = [], 0, []
            return done, codes

    def _loop(self) -> None:
        try:
            self._settle_while_armed()
        finally:
            # only a BaseException ends the loop (a gevent Timeout, a SystemExit), in a
            # settle or a wait: what it did not settle stays with the batch, a disarm
            # waiting for it goes on, and the next arm starts another thread
            with self.cond:
                self.busy, self.due, self.thread = False, None, None
                self.cond.notify_all()

    def _settle_while_armed(self) -> None:
        with self.cond:
            while True:
                if self.due is None:
                    if self.rested:  # no arm for a whole period: wait for the next one
                        self.wakes_at = math.inf
                        self.cond.wait()
                    else:
                        # between two batches, most likely: an arm soon finds this timed
                        # wait ending before its due time and need not wake the thread
                        # (woken at every arm, the thread took the GIL once a batch)
                        self.rested = True
                        self.wakes_at = time.monotonic() + self.every
                        self.cond.wait(self.every)
                    continue
                left = self.due - time.monotonic()
                if left > 0:
                    # an arm due sooner wakes it; a disarm or a later arm lets it wait on
                    self.wakes_at = self.due
                    self.cond.wait(left)
                    continue
                fresh = self.outcomes[self.settled:]  # one step: the drain appends beside it
                if not self.retries:
                    fresh = list(takewhile(lambda o: o.outcome != "f", fresh))
                if not fresh:
                    self.due = time.monotonic() + self.every
                    continue
                self.busy = True
                self.cond.release()
                try:
                    codes = self.lanes.settle(fresh)
                except Exception as exc:  # kept: they settle with the batch, as usual
                    log.warning("queue %s: could not settle %d outcome(s) early: %s",
                                self.lanes.keys.queue, len(fresh), exc)
                    codes = None
                finally:
                    self.cond.acquire()
                self.busy = False
                if codes is None:
                    self.due = None
                else:
                    self.settled += len(fresh)
                    self.codes += codes
                    if self.due is not None:
                        self.due = time.monotonic() + self.every
                self.cond.notify_all()
