"""The drain: claim and run jobs until a claim comes back empty.

Shared by the standalone Consumer and the supervisor's forked consumers; each
supplies a small set of hooks (what to do with a claimed batch, when to stop,
what follows a settle). A batch's outcomes are settled together with the next
claim in one round trip; outcomes that could not be settled because the server
was unreachable or refused writes are kept and settled first on the next drain.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from echomq.connection import UNAVAILABLE_ERRORS
from echomq.early import EarlySettle
from echomq.job import Claimed
from echomq.lanes import Lanes, Outcome
from echomq.runner import Runner
from echomq.scripts import Settled

log = logging.getLogger("echomq.drain")


class DrainHooks(Protocol):
    def stop_requested(self) -> bool:
        """True to finish the job in hand and hand back the rest of the batch."""

    def batch_size(self) -> int:
        """How many jobs the next claim may take."""

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        """A batch was leased (say so to whoever extends or releases leases)."""

    def on_start(self, claimed: Claimed, in_thread: bool = True) -> None:
        """A job is about to run (``in_thread``: a sync handler, which cannot be cancelled)."""

    def on_finish(self, claimed: Claimed) -> None:
        """A job's handler returned; its outcome is not settled yet."""

    def on_unstarted(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Jobs of the batch were handed back without running."""

    def after_settle(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        """Outcomes were settled (stale tokens are already logged)."""

    def on_dry(self) -> None:
        """A claim came back short (concurrent drain): poke again when work arrives."""


class Drain:
    """One queue's claim → run → settle loop, driven by :meth:`run`."""

    def __init__(self, lanes: Lanes, runner: Runner, hooks: DrainHooks) -> None:
        self.lanes = lanes
        self.runner = runner
        self.hooks = hooks
        self.pending: list[Outcome] = []
        # a claim failed on the way back: the server may have leased jobs this consumer
        # never saw; they go back (uncharged) before the next claim
        self.claim_unknown = False
        self.early = EarlySettle(lanes)

    def run(self) -> None:
        """Drain until a claim is empty or a stop is requested. Network errors and server
        refusals propagate, with the unsettled outcomes kept for the next call."""
        if self.pending:
            self.settle(self.pending)
        if self.claim_unknown:  # nothing is held now: every outcome is settled
            self.lanes.release_unheld(set())
            self.claim_unknown = False
        try:
            batch = self.lanes.claim(1, chain=True)
        except UNAVAILABLE_ERRORS:
            self.claim_unknown = True
            raise
        while batch:
            self.hooks.on_batch(batch)
            outcomes: list[Outcome] = []
            for i, claimed in enumerate(batch):
                if self.hooks.stop_requested():
                    rest = [(c.id, c.token) for c in batch[i:]]
                    try:
                        self.lanes.release(rest, "unstarted")
                    except UNAVAILABLE_ERRORS:
                        self.pending = outcomes  # the finished ones settle on the next call
                        raise
                    self.hooks.on_unstarted(rest)
                    break
                self.hooks.on_start(claimed)
                outcomes.append(self._run(claimed, outcomes))
                self.hooks.on_finish(claimed)
            if self.hooks.stop_requested():
                self.settle(outcomes)
                return
            try:
                codes, batch = self.lanes.settle_and_claim(outcomes, self.hooks.batch_size())
            except UNAVAILABLE_ERRORS:
                self.pending = outcomes
                self.claim_unknown = True
                raise
            self._settled(outcomes, codes)

    def _run(self, claimed: Claimed, finished: list[Outcome]) -> Outcome:
        """Run one job; past half its time limit, the ``finished`` outcomes before it are
        settled meanwhile (and taken out of the list), since its process may be ended at
        that limit."""
        limit = claimed.timeout if claimed.timeout is not None else \
            self.lanes.settings.job_timeout
        if not (finished and limit):
            return self.runner.run(claimed)
        self.early.arm(finished, limit / 2)
        try:
            return self.runner.run(claimed)
        finally:
            settled = self.early.disarm()
            if settled is not None:
                done, codes = settled
                del finished[:len(done)]
                self._settled(done, codes)

    def settle(self, outcomes: Sequence[Outcome]) -> None:
        """Settle without claiming more (keeps them pending if the server is unreachable or
        refuses writes)."""
        try:
            codes = self.lanes.settle(outcomes)
        except UNAVAILABLE_ERRORS:
            self.pending = list(outcomes)
            raise
        self.pending = []
        self._settled(outcomes, codes)

    def _settled(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        for o, code in zip(outcomes, codes, strict=True):
            if code is Settled.STALE:
                log.warning("queue %s: job %s settled with a stale lease token (its lease "
                            "expired and it was handed out again); result not recorded",
                            self.lanes.keys.queue, o.job_id)
        self.hooks.after_settle(outcomes, codes)
