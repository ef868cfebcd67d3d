"""Fresh locks for redis-py's connection pools in a forked child.

A fork copies every lock as it is: a pool's lock that a thread of the parent held at that
moment stays held in the child, where no thread will release it. redis-py resets a pool
it finds in another process (``_checkpid``) under that lock, so the first use of an
inherited pool in the child, or a destructor handing a connection back to one (a client
or PubSub the child drops), waits for good. The pools EchoMQ builds are tracked here and
their locks made anew in every child, before any other after-fork hook runs.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

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
    """In the child: new, free locks for every tracked pool (its reset then runs as ever)."""
    for pool in list(_pools):
        for name in ("_lock", "_fork_lock"):
            if hasattr(pool, name):
                setattr(pool, name, threading.RLock())


os.register_at_fork(after_in_child=_fresh_locks)
