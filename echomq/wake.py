"""The parked side of the doorbell: ``BLPOP emq:{q}:wake <beat>`` on its own connection.

The call is sent and then left outstanding, so its socket can sit in a
selector beside pipes and timers: the owner reads the reply when the socket
becomes readable, and does other work (a promote due on a local timer, a
drain) on its command connection meanwhile. Cancelling uses ``CLIENT
UNBLOCK``; a token that arrived in that instant is pushed back so no other
waiter loses its wake-up.

On a cluster the connection goes to the node owning the queue's slot. A reply of
MOVED (the slot moved, or a replica took over) or ASK (the slot is moving) ends
the call like a quiet beat; the next arm goes where the redirect pointed. After a
lost connection the next arm re-reads the cluster's slot map first, so a
promoted replica is found within the failover time.
"""

from __future__ import annotations

import select
import time
from typing import Any

import redis
import redis.exceptions

from echomq.connection import blocking_connection, is_cluster, learn_redirect, refresh

BLOCK_GRACE_S = 5.0  # a reply this late past the block means the connection is dead


class Doorbell:
    """One outstanding BLPOP on the wake key of a queue."""

    def __init__(self, client: redis.Redis, wake_key: str, beat_s: float) -> None:
        self.client = client  # command connection: CLIENT UNBLOCK and re-ringing go here
        self.wake_key = wake_key
        self.beat_s = max(0.01, beat_s)
        self.conn: Any = blocking_connection(client, wake_key, self.beat_s + BLOCK_GRACE_S)
        self.client_id: int | None = None
        self.armed_at: float | None = None
        self.redirect: tuple[str, int, bool] | None = None  # where MOVED/ASK pointed, ASK?
        self.asking = False  # this connection follows an ASK: send ASKING before each call
        self.lost = False  # the connection failed: re-read the slot map before reconnecting
        self.failed: BaseException | None = None  # seen by buffered(), raised by collect()

    @property
    def armed(self) -> bool:
        return self.armed_at is not None

    def arm(self) -> None:
        """Send the BLPOP unless one is outstanding. Raises redis ConnectionError on failure."""
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
        self.conn.send_command("BLPOP", self.wake_key, self.beat_s)
        self.armed_at = time.monotonic()

    def _route(self) -> None:
        """On a cluster, (re)make the connection for the node that serves the wake key now."""
        if not is_cluster(self.client):
            return
        if self.lost:
            refresh(self.client)
            self.lost = False
        address = self.redirect[:2] if self.redirect else None
        self.asking = bool(self.redirect and self.redirect[2])
        self.conn = blocking_connection(self.client, self.wake_key, self.beat_s + BLOCK_GRACE_S,
                                        address)
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
        """Read the BLPOP reply (call when readable): True for a token, False for a timeout."""
        if self.armed_at is None and self.failed is None:
            return False  # cancelled since the socket was seen readable: nothing to read
        if self.failed is not None:
            exc, self.failed = self.failed, None
            self.reset()
            self.lost = True
            raise redis.exceptions.ConnectionError(str(exc)) from exc
        try:
            reply = self.conn.read_response()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            self.reset()
            self.lost = True
            raise
        except (redis.exceptions.AskError, redis.exceptions.ClusterDownError,
                redis.exceptions.TryAgainError) as exc:
            self._redirected(exc)
            # as a lost connection: the owner unregisters the closed socket and re-arms
            raise redis.exceptions.ConnectionError(f"wake key served elsewhere: {exc}") from exc
        self.armed_at = None
        return reply is not None

    def _redirected(self, exc: redis.exceptions.ResponseError) -> None:
        """The slot is served elsewhere (MOVED), is moving (ASK) or has no master yet."""
        self.reset()
        if isinstance(exc, redis.exceptions.AskError):  # MovedError is an AskError too
            asking = not isinstance(exc, redis.exceptions.MovedError)
            self.redirect = (exc.host, int(exc.port), asking)
            learn_redirect(self.client, exc)
        else:
            self.lost = True

    def overdue(self) -> bool:
        """The reply is later than the block plus a grace: treat the connection as dead."""
        return (self.armed_at is not None
                and time.monotonic() - self.armed_at > self.beat_s + BLOCK_GRACE_S)

    def wait(self, timeout_s: float, *extra_fds: int) -> tuple[bool, list[int]]:
        """Arm and wait up to ``timeout_s`` for the reply or one of ``extra_fds``.

        Returns (rung, ready extra fds). ``rung`` is True when a token was taken.
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
        """End an outstanding BLPOP without stealing a token meant for another waiter."""
        if self.armed_at is None:
            return
        try:
            self._node_client().execute_command("CLIENT", "UNBLOCK", self.client_id, "TIMEOUT")
            if self.collect():
                self.client.lpush(self.wake_key, "1")
                self.client.ltrim(self.wake_key, 0, 63)
        except redis.exceptions.RedisError:
            self.reset()  # no permission for CLIENT UNBLOCK, or the server is gone
        except OSError:
            self.reset()

    def _node_client(self) -> Any:
        """A client of the node this connection is on: client ids are per node."""
        if not is_cluster(self.client):
            return self.client
        node = self.client.get_node(host=self.conn.host, port=self.conn.port)
        if node is None:
            raise redis.exceptions.ConnectionError("doorbell node left the cluster")
        return self.client.get_redis_connection(node)

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
        self.cancel()
        self.reset()
