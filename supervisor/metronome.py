"""One metronome per queue: the only blocking call for that queue, plus reap and promote.

The parked call (BLPOP on the wake list, or BZPOPMIN on the marker zset, see
echomq.wake) stays outstanding while the supervisor does other work; its
socket sits in the supervisor's selector. Local timers decide when
reap and promote are worth a round trip: promote when the schedule head is
due (the server's BLPOP timeout fires only on its ``hz`` tick, so the timer
is what makes a delayed job start on time), reap when the lease head can
have expired. An idle queue with nothing scheduled and nothing leased costs
one BLPOP per five beats (the call blocks that long: nothing but a dead
connection needs its timeout), plus a safety promote and reap every 30 beats
(for heads another replica's metronome was told about, and leases it took).

When the promote timer fires for a head known to be due, the arbiter pokes a
consumer while the promote is on its way (``pump(tell=...)``): the claim
reaches the server behind the promote instead of a round trip after it, and
the promote rings no doorbell, since a consumer is already told.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis
from echomq.supervisor.logs import event

from echomq import scripts
from echomq.config import QueueSettings
from echomq.keys import Keys
from echomq.wake import Doorbell, ring

SAFETY_BEATS = 30  # promote at least this often (in beats) while idle
PARK_BEATS = 5  # the parked call's server-side block, in beats
PROMOTE_SLICE = 10  # promote calls per turn of the loop; a larger backlog takes more turns
TRIM_LIMIT = 1000  # dead jobs dropped per call; more wait for the next turn
log = logging.getLogger("echomq.supervisor")


class Metronome:
    """The beat of one queue: rings, promote and reap, with their next deadlines."""

    def __init__(self, queue: str, client: redis.Redis, settings: QueueSettings) -> None:
        self.queue = queue
        self.keys = Keys(queue)
        self.client = client
        self.settings = settings
        self.beat_s = settings.beat_ms / 1000
        self.lease_s = settings.lease_ms / 1000
        # the local timers, not the parked call's timeout, pace promote and reap: the call
        # blocks for several beats, so an idle queue costs a fraction of a command per beat
        self.doorbell = Doorbell(client, self.keys, self.beat_s * PARK_BEATS, settings.doorbell)
        self.server_offset_ms: float | None = None  # server clock minus monotonic, in ms
        self.head_ms: float | None = None  # the schedule head's due time (server ms), if known
        self.next_promote = 0.0  # monotonic deadlines: 0 = now
        self.next_reap = 0.0
        self.next_trim = 0.0
        self.dead_trimmed = 0
        self.registered_fd: int | None = None
        self.rings = 0
        self.promoted = 0
        self.reaped = 0

    def deadline(self) -> float:
        """When the metronome must next promote or reap (monotonic seconds)."""
        return min(self.next_promote, self.next_reap)

    def collect_ring(self) -> bool:
        """Read the parked call's reply: True when claimable work was rung.

        A list token may also announce a new schedule head, so it promotes; a
        marker says which: "0" is work now, a due-scored "1" sets the promote
        timer to the new head without a read.
        """
        rung = self.doorbell.collect()
        self.heard(rung, self.doorbell.take_due())
        # a quiet beat needs no pump: the local timers already say when heads fall due
        return rung

    def heard(self, rung: bool, due: float | None) -> None:
        """A ring the doorbell took, here or in a child parked on it: claimable work
        (``rung``), or a schedule head due at ``due`` (server ms)."""
        if due is not None:
            self.rings += 1
            self.next_promote = min(self.next_promote, self._local_time(due))
            self.head_ms = due if self.head_ms is None else min(self.head_ms, due)
            bell = self.doorbell  # the head to put back when the metronome stops
            bell.next_due_ms = due if bell.next_due_ms is None else min(bell.next_due_ms, due)
        elif rung:
            self.rings += 1
            if self.doorbell.kind == "list":
                self.next_promote = 0.0

    def _local_time(self, due_ms: float) -> float:
        """A server-clock due time on the monotonic clock (now, when no offset is known)."""
        if self.server_offset_ms is None:
            return 0.0
        return (due_ms - self.server_offset_ms) / 1000

    def head_due(self, now: float) -> bool:
        """True when the promote timer fired for a schedule head known to be due by now:
        the promote about to run will make work claimable (unless another replica's
        metronome promoted it first)."""
        return (now >= self.next_promote and self.head_ms is not None
                and self.server_offset_ms is not None and self._local_time(self.head_ms) <= now)

    def pump(self, now: float, disarmed: bool,
             tell: Callable[[], bool] | None = None) -> bool:
        """Run promote and reap if their deadlines passed; True when jobs became claimable.

        ``tell`` wakes a consumer while the promote is on its way (its claim follows the
        promote on the server; see :func:`scripts.promote`); the promote then rings no
        doorbell, unless ``tell`` returns False (no consumer could be told)."""
        found = False
        if now >= self.next_promote:
            found |= self._promote(now, disarmed, tell)
        if now >= self.next_reap:
            found |= self._reap(now)
        if now >= self.next_trim:
            self._trim_dead(now)
        return found

    def _trim_dead(self, now: float) -> None:
        """Dead-job retention (keep_dead / keep_dead_s), every few beats."""
        keep_count, keep_age = self.settings.dead_retention_args
        if keep_count < 0 and keep_age < 0:
            self.next_trim = float("inf")
            return
        dropped = scripts.trim_dead(self.client, self.keys, keep_count, keep_age, TRIM_LIMIT)
        self.dead_trimmed += dropped
        self.next_trim = now if dropped == TRIM_LIMIT else now + self.beat_s * SAFETY_BEATS

    def saw_work(self, now: float) -> None:
        """Consumers will claim now: leases taken can expire one lease period from now."""
        self.next_reap = min(self.next_reap, now + self.lease_s)

    def _promote(self, now: float, disarmed: bool,
                 tell: Callable[[], bool] | None = None) -> bool:
        batch = self.settings.pump_batch
        total = 0
        for i in range(PROMOTE_SLICE):
            sent = time.monotonic()
            if i == 0 and tell is not None:
                promoted, next_due, server_now = self._promote_telling(batch, tell)
            else:
                promoted, next_due, server_now = scripts.promote(self.client, self.keys, batch)
            total += promoted
            if promoted < batch:
                break
        else:  # more is due: come back on the next turn, after signals, pipes and leases
            self.promoted += total
            self.next_promote = now
            return True
        self.promoted += total
        # the server read its clock about halfway through the round trip
        self.server_offset_ms = server_now - (sent + time.monotonic()) * 500
        self.doorbell.next_due_ms = self.head_ms = next_due if next_due >= 0 else None
        limit = self.beat_s if disarmed else self.beat_s * SAFETY_BEATS
        self.next_promote = now + limit
        if next_due >= 0:  # the timer aims at the server's clock reaching the head's due ms
            self.next_promote = min(self.next_promote, self._local_time(next_due))
        return total > 0

    def _promote_telling(self, batch: int, tell: Callable[[], bool]) -> tuple[int, float, float]:
        """One promote that wakes a consumer on its way instead of ringing; it rings after
        all when nobody could be told."""
        told: list[bool] = []
        try:
            reply = scripts.promote(self.client, self.keys, batch, lambda: told.append(tell()))
        except redis.exceptions.ConnectionError:
            # redis-py retries a plain call on a new connection (a reconnect, a Sentinel
            # primary that moved), not one written ahead; whether it ran, ringing nothing,
            # is unknown: again the plain way, and a ring
            reply = scripts.promote(self.client, self.keys, batch)
            ring(self.client, self.keys, self.doorbell.kind)
            return reply
        if reply[0] and told == [False]:  # promoted, and nobody could be told
            ring(self.client, self.keys, self.doorbell.kind)
        return reply

    def _reap(self, now: float) -> bool:
        requeued, buried, next_expiry, server_now = scripts.reap(self.client, self.keys)
        self.reaped += requeued + buried
        if requeued + buried:  # each is a stall: a lease nobody extended ran out
            event(log, "reap", "queue %s: %d lease(s) expired: requeued %d, buried %d",
                  self.keys.queue, requeued + buried, requeued, buried,
                  level=logging.WARNING, queue=self.keys.queue, count=requeued + buried)
        if next_expiry < 0:
            self.next_reap = now + self.lease_s
        else:
            self.next_reap = now + max(0.0, min(self.lease_s, (next_expiry - server_now) / 1000))
        return requeued > 0

    def retry_later(self, now: float, delay: float) -> None:
        """Put off both promote and reap by ``delay`` seconds (Valkey refused)."""
        self.next_promote = self.next_reap = now + delay
