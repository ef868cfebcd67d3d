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
import selectors
import time
from typing import TYPE_CHECKING

from echomq.supervisor import protocol
from echomq.supervisor.children import Child
from echomq.supervisor.logs import event
from echomq.supervisor.signals import sever

from echomq.connection import UNAVAILABLE_ERRORS
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
            return True
        return False

    def poke_idle(self, rt: QueueRuntime) -> Child | None:
        """Poke one idle child: its first claim rings again while work remains, and the
        next ring pokes the next child, so one job wakes one process and a burst all. A
        child that cannot be told (it died idle, its exit not yet read) passes the poke to
        the next one. Returns the child poked, None when none could be."""
        if self.house.stopping:
            return None
        for child in sorted((c for c in rt.children if c.state == "idle"),
                            key=lambda c: c.poked_at):
            if self.poke(rt, child):
                return child
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

    def found_work(self, rt: QueueRuntime, now: float) -> None:
        """Work was seen (a ring, a promote, a hand-back): note it and poke one idle child."""
        rt.work_seen = now
        rt.metronome.saw_work(now)
        self.poke_idle(rt)

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
