"""The parked side of the doorbell, in its two kinds, on its own connection.

``list`` (default): ``BLPOP emq:{q}:wake <beat>``, rung by ``LPUSH wake '1'``
(+ ``LTRIM 0 63`` past 64 rings). ``marker``: ``BZPOPMIN emq:{q}:marker <beat>``, rung by
``ZADD marker 0 "0"`` for work that is claimable now, and by ``ZADD marker
<due> "1"`` when a deferred job becomes the schedule's head. Popping a
marker scored in the future tells the parked side when to promote next (the
schedule head without a separate read); it keeps that time on its own
timer and, when it stops before acting on it, puts the marker back
(``ZADD LT``) so the next waiter learns it. Putting it back at once instead
would hand it straight to the next ``BZPOPMIN`` (its own or a sibling's)
in a loop.

The queue's meta records the kind (field ``doorbell``) and every ringing
script rings that one only, through one pattern (meta and marker keys built
from the ``emq:{q}:`` prefix, ARGV[1], like job and lane keys)::

    if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
      redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')   -- or <due>, '1' for a new head
    else
      if redis.call('LPUSH', KEYS[w], '1') > 64 then redis.call('LTRIM', KEYS[w], 0, 63) end
    end

(tests/core/test_doorbell.py checks every script against it). :func:`claim_doorbell`
records the kind when consumers
start and refuses a consumer of the other kind, whose parked calls would
never be rung. Switching is explicit (``switch=True``, the supervisor's
``--switch-doorbell``), with every consumer of the queue stopped.

The call is sent and then left outstanding, so its socket can sit in a
selector beside pipes and timers: the owner reads the reply when the socket
becomes readable, and does other work (a promote due on a local timer, a
drain) on its command connection meanwhile. Cancelling uses ``CLIENT
UNBLOCK``; a token or marker that arrived in that instant is put back so no
other waiter loses its wake-up.

On a cluster the connection goes to the node owning the queue's slot. A reply of
MOVED (the slot moved, or a replica took over) or ASK (the slot is moving) ends
the call like a lost connection; the next arm goes where the redirect pointed. After
a lost connection the next arm re-reads the cluster's slot map first, so a
promoted replica is found within the failover time.
"""

from __future__ import annotations

import select
import time
from typing import Any

import redis
import redis.exceptions

from echomq.config import DOORBELLS
from echomq.connection import blocking_connection, is_cluster, learn_redirect, refresh
from echomq.errors import ConfigError
from echomq.keys import Keys

BLOCK_GRACE_S = 5.0  # a reply this late past the block means the connection is dead
CANCEL_WAIT_S = 2.0  # how long a cancel waits for the server to run the pop it ends
CANCEL_RETRY_S = 0.005  # CLIENT UNBLOCK again after this (nothing says the pop has run)
KINDS = DOORBELLS
NOW_MEMBER = b"0"  # marker member for claimable work; "1" carries the schedule head's due


class DoorbellMismatch(ConfigError):
    """The queue's consumers park on the other kind of doorbell."""


def validate_kind(kind: object) -> str:
    """Return ``kind`` if it is a doorbell kind, else raise ConfigError."""
    if kind not in KINDS:
        raise ConfigError(f"doorbell must be one of {', '.join(KINDS)}, got {kind!r}")
    return str(kind)


def claim_doorbell(client: redis.Redis, keys: Keys, kind: str, *, switch: bool = False) -> None:
    """Record ``kind`` in the queue's meta, or refuse when it names the other kind.

    With ``switch`` the meta is overwritten and the new doorbell rung once, so
    work admitted under the old kind is picked up.
    """
    validate_kind(kind)
    if switch:
        client.hset(keys.meta, "doorbell", kind)
    elif not client.hsetnx(keys.meta, "doorbell", kind):
        current = client.hget(keys.meta, "doorbell")
        recorded = current.decode() if isinstance(current, bytes) else current
        if recorded != kind:
            raise DoorbellMismatch(
                f"queue {keys.queue!r}: its consumers park on the {recorded!r} doorbell "
                f"(recorded in {keys.meta}), this one was started with {kind!r}. Start it "
                f"with --doorbell {recorded}, or stop every consumer of the queue and start "
                f"again with --doorbell {kind} --switch-doorbell.")
        return
    ring(client, keys, kind)


def ring(client: redis.Redis, keys: Keys, kind: str) -> None:
    """Ring from Python (the scripts ring on their own): claimable work, now."""
    if kind == "marker":
        client.zadd(keys.marker, {NOW_MEMBER: 0})
    else:
        client.lpush(keys.wake, "1")
        client.ltrim(keys.wake, 0, 63)


class Doorbell:
    """One outstanding BLPOP (``list``) or BZPOPMIN (``marker``) on a queue's doorbell."""

    def __init__(self, client: redis.Redis, key: str | Keys, beat_s: float,
                 kind: str = "list") -> None:
        self.client = client  # command connection: CLIENT UNBLOCK and re-ringing go here
        self.kind = validate_kind(kind)
        if isinstance(key, Keys):
            key = key.marker if kind == "marker" else key.wake
        self.key = key
        self.beat_s = max(0.01, beat_s)
        # its replies are read only once they are in the socket (a selector, select, or a
        # CLIENT UNBLOCK that ended the call), so reads wait for no block: the timeout
        # bounds the handshake with a server that accepts but never answers
        self.conn: Any = blocking_connection(client, key, BLOCK_GRACE_S)
        self.client_id: int | None = None
        self.armed_at: float | None = None
        self.redirect: tuple[str, int, bool] | None = None  # where MOVED/ASK pointed, ASK?
        self.asking = False  # this connection follows an ASK: send ASKING before each call
        self.lost = False  # the connection failed: re-read the slot map before reconnecting
        self.failed: BaseException | None = None  # seen by buffered(), raised by collect()
        self.due_ms: float | None = None  # the last popped marker's due time (server ms)
        self.next_due_ms: float | None = None  # the owner's schedule head, put back on close

    @property
    def wake_key(self) -> str:
        """The key this doorbell blocks on."""
        return self.key

    @property
    def armed(self) -> bool:
        """True while a blocking wait is outstanding."""
        return self.armed_at is not None

    def arm(self) -> None:
        """Send the blocking pop unless one is outstanding. Raises redis ConnectionError."""
        if self.armed_at is not None:
            return
        if self.client_id is None:
            self._route()
            self.conn.connect()
            self.conn.send_command("CLIENT", "ID")
            self.client_id = int(self.conn.read_response())
        if self.asking:
            self.conn.send_command("ASKING")
            self.conn.read_response()
        verb = "BZPOPMIN" if self.kind == "marker" else "BLPOP"
        self.conn.send_command(verb, self.key, self.beat_s)
        self.armed_at = time.monotonic()

    def _route(self) -> None:
        """On a cluster, (re)make the connection for the node that serves the key now."""
        if not is_cluster(self.client):
            return
        if self.lost:
            refresh(self.client)
            self.lost = False
        address = self.redirect[:2] if self.redirect else None
        self.asking = bool(self.redirect and self.redirect[2])
        self.conn = blocking_connection(self.client, self.key, BLOCK_GRACE_S, address)
        self.redirect = None  # one connection only: afterwards the slot map decides again

    def fileno(self) -> int:
        """The socket to select on while armed."""
        sock = self.conn._sock  # redis-py keeps the socket here; no public accessor exists
        if sock is None:
            raise redis.exceptions.ConnectionError("doorbell connection is closed")
        return int(sock.fileno())

    def buffered(self) -> bool:
        """True when a reply is already in the parser's buffer (select would not see it)."""
        if self.armed_at is None:
            return False
        try:
            return bool(self.conn._parser.can_read(0))
        except (redis.exceptions.ConnectionError, OSError) as exc:
            self.failed = exc  # collect() raises it, so the owner's error path handles it
            return True

    def collect(self) -> bool:
        """Read the reply (call when readable): True for a ring of claimable work.

        A marker scored by a due time returns False and leaves that time in
        ``due_ms`` (server clock, ms) for the owner's promote timer.
        """
        reply = self._read()
        if reply is None:
            return False
        if self.kind == "marker":
            _, member, score = reply
            if member != NOW_MEMBER:
                self.due_ms = float(score)
                return False
        return True

    def take_due(self) -> float | None:
        """The due time the last marker announced (once), or None. It is also kept as the
        schedule head to put back on close, until the owner's next promote replaces it."""
        due, self.due_ms = self.due_ms, None
        if due is not None and (self.next_due_ms is None or due < self.next_due_ms):
            self.next_due_ms = due
        return due

    def _read(self) -> Any:
        """The outstanding call's reply; None when there is none (a timeout, or cancelled
        since the socket was seen readable: nothing to read)."""
        if self.failed is not None:
            exc, self.failed = self.failed, None
            self.reset()
            self.lost = True
            raise redis.exceptions.ConnectionError(str(exc)) from exc
        if self.armed_at is None:
            return None
        try:
            reply = self.conn.read_response()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            self.reset()
            self.lost = True
            raise
        except (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError):
            # the cluster refuses for now (no master for a slot, a slot half moved): raised
            # as it came, so the owner reports the refusal by its code, then re-arms
            self.reset()
            self.lost = True
            raise
        except redis.exceptions.AskError as exc:
            self._redirected(exc)
            # as a lost connection: the owner unregisters the closed socket and re-arms
            raise redis.exceptions.ConnectionError(f"doorbell key served elsewhere: {exc}") \
                from exc
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("UNBLOCKED"):
                raise
            # the server ended the call (a primary demoted to a replica, CLIENT UNBLOCK
            # ERROR): as a lost connection, so the owner re-arms where the primary is now
            self.reset()
            self.lost = True
            raise redis.exceptions.ConnectionError(f"doorbell unblocked: {exc}") from exc
        self.armed_at = None
        return reply

    def _redirected(self, exc: redis.exceptions.AskError) -> None:
        """The slot is served elsewhere (MOVED, an AskError too) or is moving (ASK)."""
        self.reset()
        asking = not isinstance(exc, redis.exceptions.MovedError)
        self.redirect = (exc.host, int(exc.port), asking)
        learn_redirect(self.client, exc)

    def overdue(self) -> bool:
        """The reply is later than the block plus a grace: treat the connection as dead."""
        return (self.armed_at is not None
                and time.monotonic() - self.armed_at > self.beat_s + BLOCK_GRACE_S)

    def wait(self, timeout_s: float, *extra_fds: int) -> tuple[bool, list[int]]:
        """Arm and wait up to ``timeout_s`` for the reply or one of ``extra_fds``.

        Returns (rung, ready extra fds). ``rung`` is True when a ring was taken.
        """
        self.arm()
        if self.buffered():
            return self.collect(), []
        ready, _, _ = select.select([self.fileno(), *extra_fds], [], [], max(0.0, timeout_s))
        others = [fd for fd in ready if fd in extra_fds]
        rung = False
        if self.fileno() in ready:
            rung = self.collect()
        elif self.overdue():
            self.reset()
        return rung, others

    def cancel(self) -> None:
        """End an outstanding pop without stealing a ring meant for another waiter."""
        if self.armed_at is None:
            return
        try:
            if not self._unblock():
                self.reset()  # the pop never ran within the wait: dropped with its connection
                return
            reply = self._read()
            if reply is not None and self.kind == "marker":
                _, member, score = reply
                if member != NOW_MEMBER or not self.claimed_at_pop():
                    self.client.zadd(self.key, {member: float(score)}, lt=True)
            elif reply is not None and not self.claimed_at_pop():
                self.client.lpush(self.key, "1")
                self.client.ltrim(self.key, 0, 63)
        except redis.exceptions.RedisError:
            self.reset()  # no permission for CLIENT UNBLOCK, or the server is gone
        except OSError:
            self.reset()

    def claimed_at_pop(self) -> bool:
        """True when the work a ring announced was claimed as the pop returned (a claim
        written behind it, echomq.parkclaim): a cancel then puts no ring back."""
        return False

    def _unblock(self) -> bool:
        """End the outstanding pop: True once its reply is on its way. CLIENT UNBLOCK goes
        out on another connection and can reach the server before the pop (just sent, or
        held by CLIENT PAUSE); it then answers 0 and the pop would block its whole time.
        No event says when the server has run the pop, so the UNBLOCK is repeated every
        few milliseconds, each wait ending early when the reply arrives."""
        client = self._node_client()
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            if client.execute_command("CLIENT", "UNBLOCK", self.client_id, "TIMEOUT") or \
                    self.buffered():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([self.fileno()], [], [], min(CANCEL_RETRY_S, left))

    def _node_client(self) -> Any:
        """A client of the node this connection is on: client ids are per node."""
        if not is_cluster(self.client):
            return self.client
        node = self.client.get_node(host=self.conn.host, port=self.conn.port)
        if node is None:
            raise redis.exceptions.ConnectionError("doorbell node left the cluster")
        return self.client.get_redis_connection(node)

    def put_back(self) -> None:
        """Marker kind: hand the schedule head the owner knows to the next waiter."""
        due = self.due_ms if self.due_ms is not None else self.next_due_ms
        self.due_ms = self.next_due_ms = None
        if self.kind != "marker" or due is None:
            return
        try:
            self.client.zadd(self.key, {b"1": due}, lt=True)
        except (redis.exceptions.RedisError, OSError):
            pass  # the server is gone; the others' safety promote finds the head

    def reset(self) -> None:
        """Drop the connection; the next arm() reconnects and sends a fresh call."""
        self.armed_at = None
        self.client_id = None
        self.failed = None
        try:
            self.conn.disconnect()
        except OSError:
            pass

    def close(self) -> None:
        """Cancel any outstanding wait, put back what it took, and reset."""
        self.cancel()
        self.put_back()
        self.reset()
