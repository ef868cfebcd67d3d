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
from echomq.lanes import Ahead, Lanes, Outcome
from echomq.runner import Runner
from echomq.scripts import Settled

log = logging.getLogger("echomq.drain")

# while a batch runs, what has finished is settled this often beside it (a round trip on a
# thread): a result or a dependent waits no longer for a slow job of the same batch
EARLY_SETTLE_S = 0.02


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
    """One queue's claim → run → settle loop, driven by :meth:`run`.

    With ``send_ahead`` (a plain server; the default there) and jobs fast enough to be
    claimed more than one at a time, a request is always in flight while jobs run: the
    claim of the next batch goes out before a batch runs (after, for the job claimed
    alone on waking, which starts at once), and once a batch has run, its settle and the
    claim of the batch after next are written before the reply holding the next batch is
    read. The server settles and claims while the consumer
    reads, parses and runs, instead of each waiting for the other; two requests are in
    flight only between that write and that read, on one connection. A job claimed
    ahead waits at most one batch (the batch size keeps that under ~10 ms); one that is
    stopped, or that a crash leaves behind, goes back unstarted and uncharged like the
    rest of its batch.
    """

    def __init__(self, lanes: Lanes, runner: Runner, hooks: DrainHooks) -> None:
        self.lanes = lanes
        self.runner = runner
        self.hooks = hooks
        self.pending: list[Outcome] = []
        # a claim failed on the way back: the server may have leased jobs this consumer
        # never saw; they go back (uncharged) before the next claim
        self.claim_unknown = False
        self.early = EarlySettle(lanes)
        # jobs leased for this drain before it runs (a claim written behind a doorbell's
        # pop, echomq.parkclaim): the next run starts with them instead of a claim
        self.first: list[Claimed] | None = None
        # the outcomes carried into the next batch went out once in a request whose reply
        # was lost: a refusal as stale may mean the first sending recorded them
        self.carried_resent = False
        # turned off by an owner that must read a settle's reply before the next job
        # starts (durability "sync" writes retries through) or must not claim past a limit
        self.send_ahead = lanes.can_send_ahead()
        # False where a retry's settle must be followed by its write-through before the next
        # job starts (durability "sync"): the batch's early settles stop at a retry
        self.retries_early = True

    def run(self) -> None:
        """Drain until a claim is empty or a stop is requested. Network errors and server
        refusals propagate, with the unsettled outcomes kept for the next call."""
        if self.pending:
            self.settle(self.pending, resent=True)
        if self.claim_unknown:  # nothing is held now but the jobs claimed for this drain
            self.lanes.release_unheld({(c.id, c.token) for c in self.first or ()})
            self.claim_unknown = False
        if self.first is not None:
            batch, self.first = self.first, None
        else:
            try:
                batch = self.lanes.claim(1, chain=True)
            except UNAVAILABLE_ERRORS:
                self.claim_unknown = True
                raise
        carried: list[Outcome] = []  # finished outcomes of the batch before, not sent yet
        ahead: Ahead | None = None  # written, reply unread: claims the batch after this one
        # the job claimed alone on waking starts first: what its claim would have sent
        # ahead goes out once it has run (a pickup waits for no request to be written)
        first = True
        while batch:
            self.hooks.on_batch(batch)
            if ahead is not None and any(c.alone for c in batch):
                batch, carried = self._join_ahead(ahead, batch)
                ahead = None
            if ahead is None and not first:
                ahead = self._send_ahead(batch, carried)
                if ahead is not None:
                    carried = []
                elif carried:  # not sent ahead: they settle before it runs
                    carried = self._settle_carried(carried)
            outcomes = carried
            try:
                rest = self._run_batch(batch, outcomes)
            except BaseException:  # a handler's KeyboardInterrupt: hold what came ahead
                if ahead is not None:
                    self._absorb(ahead, outcomes)
                raise
            if rest is not None or self.hooks.stop_requested():
                self._stop(ahead, outcomes, rest or [])
                return
            if first:
                first = False
                ahead = self._send_ahead(batch, [])
            if ahead is not None:
                after = self._send_after(ahead, outcomes)
                try:
                    batch = self._read_ahead(ahead, outcomes)
                except BaseException:
                    # whether what went behind it ran is unknown too: its connection is
                    # dropped unread (on a network error or a refusal its outcomes are
                    # pending with the rest, see _read_ahead)
                    if after is not None:
                        self.claim_unknown = True
                        after.drop()
                    raise
                ahead, carried = after, ([] if after is not None else outcomes)
                if batch:
                    continue
                if ahead is not None:  # claimed after this batch ran: read it, end if empty
                    batch, ahead = self._read_ahead(ahead, []), None
                    continue
            if self.claim_unknown:  # a reply read before a suspect or a request sent ahead
                self._release_unseen(outcomes)  # was lost; nothing is in flight now
            try:
                codes, batch = self.lanes.settle_and_claim(outcomes, self.hooks.batch_size())
            except UNAVAILABLE_ERRORS:
                self.pending = outcomes
                self.claim_unknown = True
                raise
            self._settled(outcomes, codes)
            carried = []
        if self.claim_unknown:  # the drain ended before a release point: nothing is held now
            self.lanes.release_unheld(set())
            self.claim_unknown = False

    def _run_batch(self, batch: Sequence[Claimed], outcomes: list[Outcome]
                   ) -> list[tuple[str, str]] | None:
        """Run the batch's jobs, appending their outcomes; at a stop request, the (id,
        token) pairs of the jobs not started (None when every job ran)."""
        early = len(batch) > 1 or bool(outcomes)  # something may finish before a slow job
        if early:
            self.early.arm(outcomes, self._early_every(batch), retries=self.retries_early)
        try:
            for i, claimed in enumerate(batch):
                if self.hooks.stop_requested():
                    return [(c.id, c.token) for c in batch[i:]]
                self.hooks.on_start(claimed)
                outcomes.append(self.runner.run(claimed))
                self.hooks.on_finish(claimed)
            return None
        finally:
            if early:
                done, codes = self.early.disarm()
                if done:
                    settled = outcomes[:done]
                    del outcomes[:done]
                    try:
                        self._settled(settled, codes)
                    except BaseException:
                        # a hook failed (a write-through could not read the server): the
                        # outcomes finished after them are kept, settled first next call
                        self.pending = list(outcomes)
                        raise

    def _early_every(self, batch: Sequence[Claimed]) -> float:
        """How often the outcomes finished while ``batch`` runs are settled beside it:
        :data:`EARLY_SETTLE_S`, or half the shortest time limit in the batch (a process
        ended at its limit must take no finished outcome with it)."""
        every = EARLY_SETTLE_S
        default = self.lanes.settings.job_timeout
        for c in batch:
            limit = c.timeout if c.timeout is not None else default
            if limit and limit < 2 * every:
                every = limit / 2
        return every

    def _send_ahead(self, batch: Sequence[Claimed], carried: list[Outcome]) -> Ahead | None:
        """Settle ``carried`` and claim the next batch now, unless the jobs are slow (one
        at a time: a job claimed ahead would wait a whole job), one must run alone (a
        crash suspect), or a stop is due."""
        if not self.send_ahead or any(c.alone for c in batch):
            return None
        size = self.hooks.batch_size()
        if size < 2 or self.hooks.stop_requested():
            return None
        try:
            return self.lanes.send_ahead(carried, size)
        except UNAVAILABLE_ERRORS:
            # part of the request may have gone out: the claim may have run, unseen
            self.claim_unknown = True
            return None

    def _send_after(self, ahead: Ahead, outcomes: list[Outcome]) -> Ahead | None:
        """Settle the batch just run and claim the next behind ``ahead``, before its reply
        is read: the server works while the consumer reads and runs what ``ahead`` claimed
        (two requests are in flight only here). None when the jobs turned slow or a stop
        is due: the outcomes are then carried."""
        size = self.hooks.batch_size()
        if not self.send_ahead or size < 2 or self.hooks.stop_requested():
            return None
        try:
            return self.lanes.send_behind(ahead, outcomes, size)
        except UNAVAILABLE_ERRORS:
            # the connection is dropped: reading ``ahead`` fails and keeps the outcomes
            self.claim_unknown = True
            return None

    def _join_ahead(self, ahead: Ahead, batch: list[Claimed]
                    ) -> tuple[list[Claimed], list[Outcome]]:
        """Before a batch holding a crash suspect runs, read the request in flight: its
        settle (of the batch before) must have landed, reloading a flushed script, before
        the suspect can end the process. The jobs it claimed join the batch, after it.
        Returns the batch and the outcomes still to settle before it runs (those of the
        request, when the server could not be read: whether they landed is unknown)."""
        try:
            codes, extra = ahead.read()
        except UNAVAILABLE_ERRORS:
            self.claim_unknown = True  # what it claimed comes back through the claims record
            self.carried_resent = bool(ahead.outcomes)
            return batch, list(ahead.outcomes)
        self._settled(ahead.outcomes, codes)
        if extra:
            self.hooks.on_batch(extra)
        return [*batch, *extra], []

    def _release_unseen(self, outcomes: Sequence[Outcome]) -> None:
        """A claim's reply was lost and the drain went on: hand back, uncharged, what it
        leased (the claims record names it) before the next claim, which can take it
        again, instead of leaving it leased and unseen until the drain ends (on a busy
        queue, never). ``outcomes``: what is held, finished and not settled yet. Call
        only with no request in flight. On a network error or a refusal the drain ends
        with it, ``outcomes`` pending: going on, sending ahead, it would not come back here
        before the queue ran dry, and the next call hands them back before it claims."""
        held = {(o.job_id, o.token) for o in outcomes}
        try:
            self.lanes.release_unheld(held)
        except UNAVAILABLE_ERRORS:
            self.pending = list(outcomes)
            raise
        self.claim_unknown = False

    def _settle_carried(self, carried: list[Outcome]) -> list[Outcome]:
        """Settle outcomes carried over from the batch before, before a batch that was not
        sent ahead runs (a crash of its jobs must not run them again); returns what is
        still unsettled: all of them when the server is unavailable (they go with this
        batch's settle, or stay pending)."""
        resent, self.carried_resent = self.carried_resent, False
        try:
            codes = self.lanes.settle(carried)
        except UNAVAILABLE_ERRORS:
            return carried
        self._settled(carried, codes, resent)
        return []

    def _read_ahead(self, ahead: Ahead, outcomes: list[Outcome]) -> list[Claimed]:
        """The reply of a settle-and-claim sent ahead: settles its outcomes, returns the
        jobs it claimed. On a network error both its outcomes and ``outcomes`` are kept
        for the next call (whether its settle ran is unknown; settling again is refused
        as stale, never applied twice)."""
        try:
            codes, batch = ahead.read()
        except UNAVAILABLE_ERRORS:
            self.pending = ahead.outcomes + outcomes
            self.claim_unknown = True
            raise
        self._settled(ahead.outcomes, codes)
        return batch

    def _absorb(self, ahead: Ahead, outcomes: list[Outcome]) -> None:
        """On the way out of an exception: read what was sent ahead and hold what it
        claimed, so the owner hands those jobs back with the rest; never raises."""
        try:
            extra = self._read_ahead(ahead, outcomes)
        except Exception:  # noqa: BLE001 - the exception in flight is the one to raise
            return
        if extra:
            self.hooks.on_batch(extra)

    def _stop(self, ahead: Ahead | None, outcomes: list[Outcome],
              rest: list[tuple[str, str]]) -> None:
        """A stop was requested: hand back the jobs not started (and any claimed ahead),
        in order, then settle the finished ones."""
        if ahead is not None:
            extra = self._read_ahead(ahead, outcomes)
            if extra:
                self.hooks.on_batch(extra)
                rest = rest + [(c.id, c.token) for c in extra]
        if rest:
            try:
                self.lanes.release(rest, "unstarted")
            except UNAVAILABLE_ERRORS:
                self.pending = outcomes  # the finished ones settle on the next call
                raise
            self.hooks.on_unstarted(rest)
        self.settle(outcomes)

    def settle(self, outcomes: Sequence[Outcome], resent: bool = False) -> None:
        """Settle without claiming more (keeps them pending if the server is unreachable or
        refuses writes). ``resent``: they went out before and the reply was lost."""
        try:
            codes = self.lanes.settle(outcomes)
        except UNAVAILABLE_ERRORS:
            self.pending = list(outcomes)
            raise
        self.pending = []
        self._settled(outcomes, codes, resent)

    def _settled(self, outcomes: Sequence[Outcome], codes: Sequence[Settled],
                 resent: bool = False) -> None:
        for o, code in zip(outcomes, codes, strict=True):
            if code is not Settled.STALE:
                continue
            if resent:  # a settled job's token matches nothing: the two cannot be told apart
                log.warning("queue %s: job %s: its outcome, sent again after a lost reply, was "
                            "refused: either the first sending recorded it, or its lease "
                            "expired and it was handed out again", self.lanes.keys.queue,
                            o.job_id)
            else:
                log.warning("queue %s: job %s settled with a stale lease token (its lease "
                            "expired and it was handed out again, or it was cancelled while "
                            "running); result not recorded",
                            self.lanes.keys.queue, o.job_id)
        self.hooks.after_settle(outcomes, codes)
