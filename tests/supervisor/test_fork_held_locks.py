"""A consumer forked while a supervisor thread holds a redis-py pool's lock.

The fork copies the lock as held, and no thread of the child will release it. A
destructor the child runs on something it inherited (a PubSub or a client returning its
connection to that pool) would wait on it for good: the consumer never said READY and
its queue's jobs sat waiting (seen on a cluster of thirty queues, a collection inside
the child's first client freeing the parent's garbage). Each test holds the lock in a
thread across the fork and asks for the destructor with an explicit collection.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from echomq.supervisor import protocol
from echomq.supervisor.children import fork_child
from echomq.supervisor.stops import Stops

from echomq.config import QueueSettings

DEADLINE_S = 10.0


def _handler(job: Any) -> str:
    return "ok"


@contextmanager
def _lock_held(pool: redis.ConnectionPool) -> Iterator[None]:
    """A thread holds ``pool``'s lock until the block ends; the collector stays off (a
    collection in this process would wait on the lock too) and is asked for by name."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool._lock:
            held.set()
            release.wait(DEADLINE_S * 3)

    was_enabled = gc.isenabled()
    gc.disable()
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(DEADLINE_S)
    try:
        yield
    finally:
        release.set()
        holder.join(DEADLINE_S)
        if was_enabled:
            gc.enable()


def _garbage_pubsub(client: redis.Redis, channel: str) -> None:
    """A subscribed PubSub nobody refers to any more, freed only by a collection (in a
    cycle, as a ClusterPubSub is with its own generator)."""
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1.0)  # the subscription confirmed: its connection is out
    pubsub.cycle = pubsub  # type: ignore[attr-defined]


def _reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _read_until(fd: int, wanted: bytes) -> bytes:
    """What the fd gives until ``wanted`` appears, EOF or the deadline."""
    got = b""
    deadline = time.monotonic() + DEADLINE_S
    while wanted not in got and (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got


def test_a_consumer_forked_beside_a_held_pool_lock_gets_ready(
        redis_url: str, queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    _garbage_pubsub(client, f"{queue_name}-garbage")
    collect: Callable[[], None] = gc.collect  # in the child, before its own clients
    with _lock_held(client.connection_pool):
        child = fork_child(queue_name, 0, redis_url, QueueSettings(), _handler, None,
                           [collect])
    try:
        said = _read_until(child.sock.fileno(), protocol.READY.encode())
        assert protocol.READY.encode() in said, f"the consumer never got ready: {said!r}"
    finally:
        child.sock.close()  # its EOF: the child leaves
        _reap(child.pid)
        gc.collect()
        client.close()


def test_a_consumer_forked_beside_a_held_lock_of_the_default_client_gets_ready(
        redis_url: str, queue_name: str) -> None:
    # the application's default client (a task's send, a pipeline in a thread of the
    # parent) holds its pool's lock at the fork; echomq.pools lets go of that client in the
    # child, inside the fork: its destructor ran by refcount, no collection needed
    from echomq import pools

    pools.client(redis_url).ping()
    pool = pools.client(redis_url).connection_pool  # the client itself only pools holds
    with _lock_held(pool):
        child = fork_child(queue_name, 0, redis_url, QueueSettings(), _handler, None, [])
    try:
        said = _read_until(child.sock.fileno(), protocol.READY.encode())
        assert protocol.READY.encode() in said, f"the consumer never got ready: {said!r}"
    finally:
        child.sock.close()
        _reap(child.pid)


def test_the_stop_subscription_forgotten_in_a_child_leaves_its_pool_alone(
        redis_url: str, queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url)
    stops = Stops.__new__(Stops)  # only its subscription matters to forget_in_child
    stops.pubsub = client.pubsub()
    stops.pubsub.subscribe(f"{queue_name}-stops")
    stops.pubsub.get_message(timeout=1.0)
    reader, writer = os.pipe()
    with _lock_held(client.connection_pool):
        pid = os.fork()
        if pid == 0:  # the child: forget as a consumer does, then collect
            try:
                os.close(reader)
                stops.forget_in_child()
                gc.collect()
                os.write(writer, b"done")
            finally:
                os._exit(0)
    os.close(writer)
    try:
        said = _read_until(reader, b"done")
        assert said == b"done", "the child waited on the parent's pool lock"
    finally:
        os.close(reader)
        _reap(pid)
        stops.pubsub.close()
        client.close()


@pytest.fixture(autouse=True)
def _collector_back_on() -> Iterator[None]:
    yield
    gc.enable()
