"""Fresh locks for redis-py's connection pools in a forked child.

A fork copies every lock as it is: a pool's lock that a thread of the parent held at that
moment stays held in the child, where no thread will release it. redis-py resets a pool
it finds in another process (``_checkpid``) under that lock, so the first use of an
inherited pool in the child, or a destructor handing a connection back to one (a client
or PubSub the child drops), waits for good. The pools EchoMQ builds are tracked here and
their locks made anew in every child, before any other after-fork hook runs.

The same holds for the locks OpenSSL keeps inside a TLS context (its client key's, taken
while a handshake signs with it). redis-py shares one ``SSLContext`` per TLS configuration
in a process; a child that reused the parent's would wait for good on a lock a parent
thread held mid-handshake at the fork. Each child forgets the shared contexts and builds
its own at its first connection.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import redis.utils

_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def track(pool: Any) -> Any:
    """Remember a pool (a ``redis.ConnectionPool``), so a forked child unlocks it; returns it."""
    _pools.add(pool)
    return pool


def tracked(client: Any) -> Any:
    """:func:`track` a redis-py client's pool; returns the client."""
    track(client.connection_pool)
    return client


def _fresh_locks() -> None:
    """In the child: new, free locks for every tracked pool (its reset then runs as ever),
    and no TLS context shared with the parent."""
    for pool in list(_pools):
        for name in ("_lock", "_fork_lock"):
            if hasattr(pool, name):
                setattr(pool, name, threading.RLock())
    _forget_tls_contexts()


def _forget_tls_contexts() -> None:
    """Drop redis-py's process-wide cache of TLS contexts (redis-py >= 8 keeps one)."""
    shared = getattr(redis.utils, "_SHARED_SSL_CONTEXTS", None)
    if shared is not None:
        shared.clear()


os.register_at_fork(after_in_child=_fresh_locks)
