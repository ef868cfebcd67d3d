"""A queue that goes down takes its doorbell socket out of the arbiter's selector."""

from __future__ import annotations

import socket
import time

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
