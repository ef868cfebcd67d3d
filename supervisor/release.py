"""The release of a dead child's jobs: each handed back at once, charged for what it was
doing, instead of waiting out its lease.

Owns the charge of each job a dead child held (only the one running pays a stall; of
several running, none does and each runs alone next time; one killed at its time limit
fails), the hand-back of what its claims record names beyond its holdings (leased, never
read), and the hand-backs kept while the server could not take them, retried when it
answers. The children call :meth:`Releases.release_child` when one exits.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from echomq.supervisor.children import Child
from echomq.supervisor.holdings import FINISHED, HELD, RUNNING, Held, runs_by_mode
from echomq.supervisor.logs import event

from echomq import scripts
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.lanes import Lanes, Outcome, unheld_claims
from echomq.runner import retry_ms_of, timed_out_text

if TYPE_CHECKING:
    from echomq.supervisor.arbiter import Arbiter
    from echomq.supervisor.runtime import QueueRuntime

log = logging.getLogger("echomq.supervisor")
# what a dead child's jobs cost them: only the one that was running is charged a stall;
# one that finished (outcome not settled) or never started runs again without a charge
RELEASE_MODES = {RUNNING: "stall", FINISHED: "unstarted", HELD: "unstarted"}
# several were running: which one killed the process is not known, so none is charged and
# each runs alone next time (a crash during a lone run is its own)
SUSPECT_MODES = {RUNNING: "suspect", FINISHED: "unstarted", HELD: "unstarted"}
UNCHARGED = {RUNNING: "unstarted", FINISHED: "unstarted", HELD: "unstarted"}


class Releases:
    """Hands back what dead children held; keeps what the server could not take."""

    def __init__(self, house: Arbiter) -> None:
        self.house = house

    def release_child(self, rt: QueueRuntime, child: Child, drained: bool = False
                       ) -> tuple[int, list[str], int]:
        """Hand back every job a dead child held, each charged for what it was doing;
        jobs killed for their time limit fail instead. ``drained``: the supervisor ended
        it at the drain deadline, so every running job ran past it and counts a stall.
        Returns how many were held, the ids of those charged a stall, and how many matched
        no token: no longer the child's (a settle it wrote landed, its reply unread; or,
        rarely, a hand-back or a reap did)."""
        held = child.holdings.entries()
        child.holdings.close()
        self._release_unheld(rt, child, {h.pair for h in held})
        timed_out = [h for h in held if h.job_id in child.timed_out]
        rest = [h for h in held if h.job_id not in child.timed_out]
        if timed_out:
            self._fail_timed_out(rt, child, timed_out)
        running = sum(1 for h in rest if h.state == RUNNING)
        modes = UNCHARGED if child.timed_out or child.cancelled else (
            SUSPECT_MODES if running > 1 and not drained else RELEASE_MODES)
        landed = 0
        for mode, run in runs_by_mode(rest, modes):
            counts = self.release(rt, [h.pair for h in run], mode)
            if counts is not None:
                landed += len(run) - sum(counts)
        return len(held), [h.job_id for h in rest if modes[h.state] == "stall"], landed

    def _release_unheld(self, rt: QueueRuntime, child: Child, held: set[tuple[str, str]]
                        ) -> None:
        """Hand back, uncharged, the jobs the child's claims leased that it never held (it
        died before it read a claim's reply): its claims' record names them. Jobs it
        settled or handed back meanwhile no longer match their tokens and stay as they are.
        Released before the held ones, which go in front of them."""
        if child.claimer:
            self.release_claims(rt, child.claimer, held)

    def release_claims(self, rt: QueueRuntime, claimer: str, held: set[tuple[str, str]]
                        ) -> bool:
        """Retire a dead consumer's claimer name and read its claims record in one call
        (retire.lua: a claim it sent before it died that the server runs only after this
        read leases nothing, instead of jobs no process would run, extend or hand back),
        hand back what it did not hold, and only then drop the record: a read whose reply
        was lost (the server ran it) is read again, and a release that ran twice matches
        no token the second time."""
        key = rt.metronome.keys.claims(claimer)
        try:
            raw = scripts.retire(self.house.client, rt.metronome.keys, claimer,
                                 rt.settings.lease_ms)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("queue %s: could not read a dead consumer's claims (%s); kept until "
                        "the server answers", rt.spec.name, exc)
            rt.unreleased.append(("claims", claimer, held))
            return False
        unheld = unheld_claims(raw, held)
        if unheld and self.release(rt, unheld, "unstarted", quiet=True) is None:
            return False  # kept as jobs: their leases are extended until it answers
        try:
            self.house.client.delete(key)
        except UNAVAILABLE_ERRORS:
            pass  # nobody appends to it any more: it expires ten leases after its last claim
        return True

    def retry(self, rt: QueueRuntime) -> None:
        """Hand back what a dead child held, kept while the server could not take it."""
        pending, rt.unreleased = rt.unreleased, []
        for i, (kind, what, detail) in enumerate(pending):
            done = (self.release_claims(rt, what, detail) if kind == "claims"
                    else self.release(rt, what, detail) is not None)
            if not done:  # kept again (appended): keep the rest too, in their order
                rt.unreleased.extend(pending[i + 1:])
                return

    def _fail_timed_out(self, rt: QueueRuntime, child: Child, held: list[Held]) -> None:
        """Settle jobs whose process was ended at their time limit as failed attempts."""
        lanes = Lanes(self.house.client, rt.metronome.keys, rt.settings)
        try:
            outcomes = []
            for h in held:
                attempts, backoff = self.house.client.hmget(rt.metronome.keys.job(h.job_id),
                                                      "attempts", "backoff")
                retry_ms = retry_ms_of(rt.settings, int(attempts or 1),
                                       (backoff or b"").decode())
                text = (f"{timed_out_text(child.timed_out[h.job_id])}: the supervisor ended "
                        f"process {child.pid}")
                outcomes.append(Outcome(h.job_id, h.token, "f", text, retry_ms))
            lanes.settle(outcomes)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("queue %s: could not fail %d timed-out job(s) (%s); their leases will "
                        "expire", rt.spec.name, len(held), exc)

    def release(self, rt: QueueRuntime, held: list[tuple[str, str]], mode: str,
                 quiet: bool = False) -> tuple[int, int] | None:
        """Hand jobs back (reap.lua's modes); ``quiet``: say nothing when none went back.
        Returns (requeued, buried); None when the server could not take them: kept, and
        retried when it answers."""
        try:
            requeued, buried = scripts.release(self.house.client, rt.metronome.keys, held, mode)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("queue %s: could not release %d job(s) (%s); kept until the server "
                        "answers", rt.spec.name, len(held), exc)
            rt.unreleased.append(("jobs", held, mode))
            return None
        if requeued:
            rt.work_seen = time.monotonic()
            self.house.doorbells.poke_idle(rt)
        if not (quiet and not requeued + buried):
            event(log, "release", "queue %s: requeued %d, buried %d (mode %s)", rt.spec.name,
                  requeued, buried, mode, queue=rt.spec.name, count=requeued + buried)
        return requeued, buried
