"""A doorbell that carries a claim behind its blocking pop, on the same connection.

The server runs the commands of one connection in order, and a client blocked in BLPOP
(or BZPOPMIN) has the commands written after it run as soon as the pop returns: at a
ring, at the end of its block, or when it is cancelled. A claim written behind the pop
therefore leases the rung work at the ring, and both replies come back together: one
wake-up brings the jobs, where a ring and then a claim of its own take two.

What the claim leased is the owner's from then on, whatever ended the pop: it runs the
jobs, or hands them back unstarted. A claim whose reply is lost (the connection dropped
with it unread) may have leased jobs unseen: :attr:`ClaimingDoorbell.unknown` says so,
and the owner hands back what its claims record names beyond what it holds. A plain
server only: on a cluster the doorbell's node may move between the two commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from echomq import scripts
from echomq.job import Claimed, parse_claimed
from echomq.keys import Keys
from echomq.packing import pack_calls
from echomq.wake import Doorbell

ScriptCall = tuple[scripts.LuaScript, Sequence[str], Sequence[Any]]


class ClaimingDoorbell(Doorbell):
    """A :class:`~echomq.wake.Doorbell` whose every pop has ``claim`` written behind it."""

    def __init__(self, client: redis.Redis, keys: Keys, beat_s: float, kind: str,
                 claim: ScriptCall) -> None:
        super().__init__(client, keys, beat_s, kind)
        self.claim = claim
        self.sent = False  # a claim is written behind the outstanding pop, reply unread
        self.claimed: list[Claimed] = []  # what the claims read since the last take
        self.unknown = False  # a claim's reply was lost: it may have leased jobs unseen
        self.claim_read = False  # the claim behind the last pop ran and was read

    def arm(self) -> None:
        """Send the pop and the claim behind it, unless a pop is outstanding."""
        if self.armed_at is not None:
            return
        super().arm()
        try:
            # no health check: its PING would read the pop's reply as its own
            self.conn.send_packed_command(pack_calls(self.conn, [self.claim]),
                                          check_health=False)
        except BaseException:
            self.sent = True  # part of it may have reached the server
            self.reset()
            raise
        self.sent = True

    def _read(self) -> Any:
        """The pop's reply, then the claim's: its jobs are kept for :meth:`take`."""
        outstanding = self.armed_at is not None
        try:
            reply = super()._read()
        except BaseException:
            if self.sent:  # the claim's reply is still unread: drop it with the connection
                self.reset()
            raise
        if outstanding and self.sent:
            self._read_claim()
        return reply

    def _read_claim(self) -> None:
        self.sent = False
        self.claim_read = False
        try:
            flat = self.conn.read_response()
        except redis.exceptions.NoScriptError:
            return  # not run (the server lost its scripts): the next drain loads it again
        except redis.exceptions.ResponseError:
            # refused (OOM, READONLY) or failed: the owner's drain checks its claims record
            self.unknown = True
            return
        except (redis.exceptions.RedisError, OSError):
            self.unknown = True
            self.reset()
            self.lost = True
            raise
        self.claimed.extend(parse_claimed(flat))
        self.claim_read = True

    def claimed_at_pop(self) -> bool:
        """True when the claim behind the last pop ran and its reply was read: it took the
        work the ring announced (and rang again, chained, if more waits)."""
        return self.claim_read

    def take(self) -> tuple[list[Claimed], bool]:
        """The jobs the claims behind the pops leased since the last take, and whether a
        claim's reply was lost meanwhile (once each)."""
        claimed, unknown = self.claimed, self.unknown
        self.claimed, self.unknown = [], False
        return claimed, unknown

    def reset(self) -> None:
        """Drop the connection; a claim written and not read becomes unknown."""
        if self.sent:
            self.sent = False
            self.unknown = True
        super().reset()
