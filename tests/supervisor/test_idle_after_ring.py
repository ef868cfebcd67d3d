"""A job admitted between a child's last empty claim and the arbiter reading that child's
IDLE: its ring found no idle child to poke, so the IDLE itself must get the child poked
again, or the job waits for an unrelated ring. Stand-in children on socketpairs, a real
server; the moment is forced by reading the ring before the child's IDLE is sent."""

from __future__ import annotations

import select
import socket
import time

import redis
from echomq.supervisor import protocol
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.children import Child
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.settings import QueueSpec, Settings

import echomq


def _poked(sock: socket.socket) -> bool:
    """True when the arbiter wrote a poke to this stand-in child (read and consumed)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    return sock.recv(16) == protocol.POKE


def test_a_job_admitted_before_the_idle_of_a_child_whose_claim_was_empty_is_picked_up(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r)
    arbiter = Arbiter(Settings(redis_url=redis_url, queues=(
        QueueSpec(name=queue_name, handler="json:dumps", processes=1),)))
    (rt,) = arbiter.queues.values()
    ours, theirs = socket.socketpair()
    child = Child(queue_name, 0, pid=0, sock=ours, state="idle",
                  reader=protocol.LineReader(ours.fileno()), holdings=Holdings(1))
    rt.slots[0].child = child
    try:
        arbiter.doorbells.arm_all(time.monotonic())  # an idle child: the doorbell parks
        assert arbiter.doorbells.poke(rt, child) and _poked(theirs)  # the child claims...
        # ...and finds nothing; before its IDLE reaches the arbiter a job is admitted
        q.add("x", {})
        ready, _, _ = select.select([rt.metronome.doorbell.fileno()], [], [], 5.0)
        assert ready, "the admit rang no doorbell"
        arbiter.doorbells.on_ring(rt)  # the loop reads the ring: nobody idle to poke
        assert child.state == "busy" and not _poked(theirs)
        theirs.sendall(protocol.idle_line(0, 0))  # now the child's IDLE arrives
        select.select([ours], [], [], 5.0)
        arbiter.children.on_readable(child)
        assert _poked(theirs), "the child went idle beside a job admitted after its claim"
        assert child.state == "busy"
    finally:
        rt.metronome.doorbell.close()
        ours.close()
        theirs.close()


def test_an_idle_with_no_ring_since_the_poke_rests(redis_url: str, queue_name: str) -> None:
    arbiter = Arbiter(Settings(redis_url=redis_url, queues=(
        QueueSpec(name=queue_name, handler="json:dumps", processes=1),)))
    (rt,) = arbiter.queues.values()
    ours, theirs = socket.socketpair()
    child = Child(queue_name, 0, pid=0, sock=ours, state="idle",
                  reader=protocol.LineReader(ours.fileno()), holdings=Holdings(1))
    rt.slots[0].child = child
    try:
        assert arbiter.doorbells.poke(rt, child) and _poked(theirs)
        theirs.sendall(protocol.idle_line(0, 0))
        select.select([ours], [], [], 5.0)
        arbiter.children.on_readable(child)
        assert child.state == "idle" and not _poked(theirs)
    finally:
        rt.metronome.doorbell.close()
        ours.close()
        theirs.close()
