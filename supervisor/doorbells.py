"""The doorbells: each queue's parked call on the server, and the pokes that wake children.

Owns arming a queue's doorbell (a BLPOP, or the marker's wait) while any of its children
could take work, and replacing one whose connection died without a word; reading a ring
and poking one idle child for it (one job wakes one process, a burst all of them, as
each first claim rings again while work remains); ringing for the consumers of other
replicas. The loop calls :meth:`Doorbells.arm_all` before it blocks and
:meth:`Doorbells.on_ring` when a doorbell's socket is readable.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from typing import TYPE_CHECKING

from echomq.supervisor import protocol
from echomq.supervisor.children import Child
from echomq.supervisor.logs import event
from echomq.supervisor.signals import sever

from echomq.connection import UNAVAILABLE_ERRORS
from echomq.lanes import unheld_claims
from echomq.wake import BLOCK_GRACE_S
from echomq.wake import ring as ring_doorbell

if TYPE_CHECKING:
    from echomq.supervisor.arbiter import Arbiter
    from echomq.supervisor.runtime import QueueRuntime

log = logging.getLogger("echomq.supervisor")


class Doorbells:
    """Arms, reads and rings the queues' doorbells; pokes idle children."""

    def __init__(self, house: Arbiter) -> None:
        self.house = house

    def poke(self, rt: QueueRuntime, child: Child) -> bool:
        """Tell an idle child to claim; False when it could not be told (a full or closed
        pipe: the child is busy or gone)."""
        if not rt.healthy:
            return False  # it could not settle or claim; every idle child is poked on recovery
        if child.send(protocol.POKE):
            child.state = "busy"
            child.poked_at = time.monotonic()
            if rt.bell_holder is child:  # the poke ends its park (it puts back what it took)
                rt.bell_holder = None
            return True
        return False

    def hand_bell(self, rt: QueueRuntime) -> bool:
        """Hand the queue's doorbell to an idle child that can park on it itself, so a
        ring wakes the process that claims (one wake-up less: no read of the ring here,
        no poke over the pipe). False when none could take it; the metronome parks then."""
        now = time.monotonic()
        if now < rt.park_after:
            return False
        for child in sorted((c for c in rt.children if c.state == "idle" and c.can_park
                             and c.park_after <= now), key=lambda c: c.poked_at):
            if child.send(protocol.BELL):
                rt.bell_holder = child
                child.parked_seen = now
                self.unregister(rt)  # nothing outstanding on the metronome's own socket
                return True
        return False

    def holder_deadline(self, rt: QueueRuntime) -> float | None:
        """When the child parked on the doorbell counts as silent (frozen, swapped out):
        two of its calls' blocks and a grace after its last word."""
        holder = rt.bell_holder
        if holder is None:
            return None
        return holder.parked_seen + 2 * rt.metronome.doorbell.beat_s + BLOCK_GRACE_S

    def watch_holder(self, rt: QueueRuntime, now: float) -> None:
        """Take the doorbell back from a parked child silent past its deadline: nothing
        else would wake the queue while it holds the doorbell. Its calls' blocks have run
        out by then (it cannot take another ring); one it took meanwhile is rung again."""
        deadline = self.holder_deadline(rt)
        if deadline is None or now < deadline:
            return
        holder = rt.bell_holder
        assert holder is not None
        event(log, "doorbell-holder-silent", "queue %s: consumer %d parked on the doorbell "
              "said nothing for %.1fs; the supervisor parks instead", rt.spec.name,
              holder.pid, now - holder.parked_seen, level=logging.WARNING, queue=rt.spec.name,
              pid=holder.pid)
        rt.bell_holder = None
        holder.park_after = float("inf")  # until it speaks again (its IDLE)
        holder.claims_unchecked = True
        self.end_if_leased(rt, holder)
        self.take_back(rt)

    def end_if_leased(self, rt: QueueRuntime, holder: Child) -> None:
        """A silent holder whose claim behind its pop (echomq.parkclaim) leased a job at a
        ring it has not read is ended: its exit hands the job back uncharged, for another
        consumer, instead of its lease being extended for a process that may never run
        it. Its calls' blocks have run out by now, so no claim of its runs later. Anything
        it says first (read here) means it thawed and reads the reply itself. When the
        server does not answer, the lease pass (leases.py) extends the job and asks again."""
        self.house.children.consume_lines(holder)  # clears claims_unchecked if it spoke
        if not holder.claims_unchecked:
            return
        try:
            leased = self._leased_unseen(rt, holder)
        except UNAVAILABLE_ERRORS:
            return  # the server is away: asked again by the lease pass once it answers
        self.house.children.consume_lines(holder)  # it may have thawed meanwhile
        if not holder.claims_unchecked:
            return
        holder.claims_unchecked = False
        if not leased:
            return
        event(log, "doorbell-holder-ended", "queue %s: consumer %d, silent on the doorbell, "
              "leased a job it has not read; ending it so the job goes to another",
              rt.spec.name, holder.pid, level=logging.WARNING, queue=rt.spec.name,
              pid=holder.pid)
        holder.respawn_now = True  # ended on purpose: its exit is not a crash
        try:
            os.kill(holder.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it exited meanwhile: its exit hands the job back

    def parked_overdue(self, rt: QueueRuntime, child: Child, now: float) -> bool:
        """True for the holder when it has not said it still parks for longer than a block:
        frozen, perhaps, with a job its parked claim leased unread."""
        return child is rt.bell_holder and now - child.parked_seen > rt.metronome.doorbell.beat_s

    def _leased_unseen(self, rt: QueueRuntime, child: Child) -> bool:
        """True when the newest claim in the child's claims record (a parked child's last
        claim is the one behind its pop) still leases its job to it, unheld."""
        if not child.claimer:
            return False
        keys = rt.metronome.keys
        client = self.house.client
        raw = client.lrange(keys.claims(child.claimer), -2, -1)
        pairs = unheld_claims(raw, {h.pair for h in child.holdings.entries()})
        if not pairs:
            return False
        [(job_id, token)] = pairs
        state, held_by = client.hmget(keys.job(job_id), "state", "token")
        return state == b"active" and held_by == token.encode()

    def take_back(self, rt: QueueRuntime) -> None:
        """The doorbell is the metronome's again after a holder may have taken a ring and
        not acted on it (it died, froze, or its call failed): ring once, and promote at the
        next pump, for a schedule head's marker that call may have taken unsaid."""
        rt.metronome.next_promote = 0.0
        self.ring(rt)

    def heard_from_holder(self, rt: QueueRuntime, child: Child, line: str) -> None:
        """A parked child's RUNG or UNPARKED line."""
        parts = line.split()
        now = time.monotonic()
        if rt.bell_holder is not child and (parts[0] == protocol.PARKED or
                                            parts[1:2] == ["d"]):
            # parked without the doorbell (thawed after it was taken back): a poke ends it,
            # unless one is on its way already
            if child.state == "idle":
                self.poke(rt, child)
        elif parts[0] == protocol.PARKED or parts[1:2] == ["d"]:
            child.parked_seen = now
        released = parts[0] == protocol.UNPARKED or parts[1:2] == ["w"]
        if released and rt.bell_holder is child:
            rt.bell_holder = None  # the doorbell is the metronome's again
        if parts[0] == protocol.UNPARKED:
            # the metronome parks for a beat: its own call finds out whether the server is
            # down (the outage's probe and backoff), or only that child's connection failed;
            # a ring its failed call took with the reply lost is rung again
            rt.park_after = now + rt.metronome.beat_s
            if not self.house.stopping and rt.healthy:
                self.take_back(rt)
        if parts[0] != protocol.RUNG:
            return
        if len(parts) > 2 and parts[1] == "d":
            rt.metronome.heard(False, float(parts[2]))
            return
        rt.metronome.heard(True, None)
        rt.metronome.saw_work(time.monotonic())
        if child.state == "idle":  # it claims now; its IDLE follows
            child.state = "busy"
            child.poked_at = time.monotonic()

    def poke_idle(self, rt: QueueRuntime, ring_holder: bool = True) -> Child | None:
        """Poke one idle child: its first claim rings again while work remains, and the
        next ring pokes the next child, so one job wakes one process and a burst all. A
        child that cannot be told (it died idle, its exit not yet read) passes the poke to
        the next one. Returns the child poked, None when none could be. A child parked on
        the doorbell is not poked (that would end its park): when it is the only idle one
        it is woken through the doorbell instead, rung here unless ``ring_holder`` is False
        (the caller's own script rings it)."""
        if self.house.stopping:
            return None
        for child in sorted((c for c in rt.children
                             if c.state == "idle" and c is not rt.bell_holder),
                            key=lambda c: c.poked_at):
            if self.poke(rt, child):
                return child
        if ring_holder and rt.bell_holder is not None:
            self.ring(rt)
        return None

    def on_ring(self, rt: QueueRuntime) -> None:
        """Read a queue's doorbell reply; a ring pokes an idle child."""
        now = time.monotonic()
        try:
            rung = rt.metronome.collect_ring()
        except UNAVAILABLE_ERRORS as exc:
            self.unregister(rt)
            self.house.queue_down(rt, now, exc)
            return
        if rung:
            self.found_work(rt, now)  # poke first: promote can wait a few microseconds

    def ring(self, rt: QueueRuntime) -> None:
        """Ring the queue's doorbell (a quiet promote whose told child left unheard)."""
        try:
            ring_doorbell(self.house.client, rt.metronome.keys, rt.settings.doorbell)
        except UNAVAILABLE_ERRORS as exc:  # every idle child is poked when it comes back
            self.house.queue_down(rt, time.monotonic(), exc)

    def found_work(self, rt: QueueRuntime, now: float, rang: bool = False) -> None:
        """Work was seen (a ring, a promote, a hand-back): note it and poke one idle child
        (``rang``: the script that found it rang the doorbell, which wakes a child parked
        on it)."""
        rt.work_seen = now
        rt.metronome.saw_work(now)
        self.poke_idle(rt, ring_holder=not rang)

    def arm_all(self, now: float) -> None:
        """Keep each queue's BLPOP outstanding while any of its children could take work."""
        if self.house.stopping:
            return
        for rt in self.house.queues.values():
            # a reply already in the socket (it came after the selector's last look) is
            # read here; the call it ends is then sent again, so the loop never blocks
            # with a child idle and nothing parked
            while self.arm(rt, now):
                self.on_ring(rt)

    def arm(self, rt: QueueRuntime, now: float) -> bool:
        """Arm one queue's doorbell if it should be; True when its reply is already here."""
        bell = rt.metronome.doorbell
        if not rt.healthy and now < rt.metronome.deadline():
            return False
        anyone_idle = any(c.state in ("idle", "starting") for c in rt.children)
        if not anyone_idle or not rt.healthy:
            return False
        if rt.bell_holder is not None:
            return False  # a child is parked on the doorbell: one blocking call per queue
        if not bell.armed and self.hand_bell(rt):
            return False
        if bell.overdue() and not bell.buffered():
            # no reply long past the block: the connection died without a word (a host
            # gone, a partition); nothing would ever make its socket readable
            event(log, "doorbell-overdue", "queue %s: no reply on the doorbell for %.1fs; "
                  "reconnecting", rt.spec.name, time.monotonic() - (bell.armed_at or 0.0),
                  level=logging.WARNING, queue=rt.spec.name)
            self.unregister(rt)
            bell.reset()
            bell.lost = True
        try:
            bell.arm()
            fd = bell.fileno()
            # a close that came after the last select shows here, not in the selector
            buffered = bell.buffered()
        except UNAVAILABLE_ERRORS as exc:
            self.unregister(rt)
            self.house.queue_down(rt, now, exc)
            return False
        if rt.metronome.registered_fd != fd:
            self.unregister(rt)
            self.house.selector.register(fd, selectors.EVENT_READ, rt)
            rt.metronome.registered_fd = fd
        return buffered

    def unregister(self, rt: QueueRuntime) -> None:
        """Take a queue's doorbell socket out of the selector (its fd may be reused)."""
        fd = rt.metronome.registered_fd
        if fd is not None:
            try:
                self.house.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
            rt.metronome.registered_fd = None

    def forget_in_child(self, rt: QueueRuntime) -> None:
        """In a forked child: drop the doorbell's socket without closing it for the parent."""
        sever(getattr(rt.metronome.doorbell.conn, "_sock", None))
        rt.metronome.doorbell.conn._sock = None
