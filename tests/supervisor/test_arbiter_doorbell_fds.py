"""The arbiter's doorbells in its selector: a queue that goes down takes its socket out,
and a reply read outside the selector (already in the socket when the loop comes round)
is followed by a fresh blocking call before the loop blocks."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from echomq.supervisor import protocol
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.children import Child
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.settings import QueueSpec, Settings


def test_a_queue_down_unregisters_its_doorbell_so_its_fd_can_be_reused(
        redis_url: str, queue_name: str) -> None:
    names = [f"{queue_name}-a", f"{queue_name}-b"]
    arbiter = Arbiter(Settings(redis_url=redis_url, queues=tuple(
        QueueSpec(name=n, handler="json:dumps") for n in names)))
    pairs = []
    for rt in arbiter.queues.values():  # one idle consumer each, so the doorbells arm
        ours, theirs = socket.socketpair()
        pairs += [ours, theirs]
        rt.slots[0].child = Child(rt.spec.name, 0, pid=0, sock=ours, state="idle",
                                  reader=protocol.LineReader(ours.fileno()),
                                  holdings=Holdings(1))
    a, b = arbiter.queues.values()
    try:
        arbiter._arm_doorbells(time.monotonic())
        old_fd = a.metronome.registered_fd
        assert old_fd is not None and b.metronome.registered_fd is not None
        # a's beat fails (a node of its slot is down): its doorbell socket is closed
        arbiter._queue_down(a, time.monotonic(), redis.exceptions.ConnectionError("down"))
        # b reconnects: the lowest free descriptor, a's old one, is what its socket gets
        arbiter._unregister_doorbell(b)
        b.metronome.doorbell.reset()
        arbiter._arm_doorbells(time.monotonic())  # raised KeyError: fd already registered
        assert b.metronome.registered_fd == b.metronome.doorbell.fileno()
        registered = {key.fd for key in arbiter.selector.get_map().values()}
        assert registered == {b.metronome.registered_fd}
    finally:
        for rt in arbiter.queues.values():
            rt.metronome.doorbell.close()
        for sock in pairs:
            sock.close()


@contextmanager
def _one_queue_with_idle_children(redis_url: str, queue: str, children: int,
                                  beat_ms: int = 1000) -> Iterator[tuple[Arbiter, list]]:
    """An arbiter for one queue whose slots hold ``children`` idle stand-in consumers
    (socketpairs: what the arbiter writes to them can be read back)."""
    arbiter = Arbiter(Settings(redis_url=redis_url, beat_ms=beat_ms, queues=(
        QueueSpec(name=queue, handler="json:dumps", processes=children),)))
    (rt,) = arbiter.queues.values()
    theirs = []
    for slot in rt.slots:
        ours, their_end = socket.socketpair()
        theirs.append(their_end)
        slot.child = Child(queue, slot.index, pid=0, sock=ours, state="idle",
                           reader=protocol.LineReader(ours.fileno()), holdings=Holdings(1))
    try:
        yield arbiter, theirs
    finally:
        rt.metronome.doorbell.close()
        for slot in rt.slots:
            if slot.child is not None:
                slot.child.sock.close()
        for sock in theirs:
            sock.close()


def _wait_readable(fd: int, timeout: float = 5.0) -> None:
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, "no reply within the deadline"


def _is_outstanding(r: redis.Redis, bell_client_id: int) -> bool:
    """True when the doorbell's connection is blocked in its pop on the server."""
    clients = {int(c["id"]): c for c in r.client_list()}
    return "b" in clients[bell_client_id]["flags"]


def test_a_quiet_beat_read_outside_the_selector_is_followed_by_a_new_call(
        redis_url: str, queue_name: str) -> None:
    # the parked pop ends on its timeout just after the selector's last look: the loop
    # meets its empty reply when it next arms the doorbells, and must park again before
    # blocking, or a ring admitted meanwhile waits for the loop's 5 s cap
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 1, beat_ms=50) as (arbiter, _):
        (rt,) = arbiter.queues.values()
        bell = rt.metronome.doorbell
        arbiter._arm_doorbells(time.monotonic())
        _wait_readable(bell.fileno())  # the empty reply of a quiet beat, not yet read
        arbiter._arm_doorbells(time.monotonic())
        assert bell.armed, "the doorbell was left unarmed after its reply was read"
        assert _is_outstanding(r, bell.client_id)


def test_a_ring_read_outside_the_selector_pokes_one_child_and_parks_for_the_next(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        bell = rt.metronome.doorbell
        arbiter._arm_doorbells(time.monotonic())
        r.lpush(rt.metronome.keys.wake, "1")  # one job's ring
        _wait_readable(bell.fileno())
        arbiter._arm_doorbells(time.monotonic())
        states = sorted(c.state for c in rt.children)
        assert states == ["busy", "idle"]  # one job wakes one consumer ...
        poked = [s for s in theirs if select.select([s], [], [], 0)[0]]
        assert len(poked) == 1 and poked[0].recv(16) == protocol.POKE
        # ... and the other, still idle, is parked on the doorbell for the next one
        assert bell.armed and _is_outstanding(r, bell.client_id)
