"""How the arbiter turns rings into pokes, with stand-in children on socketpairs and a
real server: a queue that goes down takes its doorbell socket out of the selector; a
reply read outside the selector is followed by a fresh blocking call; a reply overdue
on a dead connection is replaced; a poke that cannot be delivered, or that a child
left unanswered, goes to a sibling; a stopping child is never poked."""

from __future__ import annotations

import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from echomq.supervisor import protocol
from echomq.supervisor.arbiter import Arbiter, epoll_ms, whole_ms
from echomq.supervisor.children import Child
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.settings import QueueSpec, Settings

import echomq

from .conftest import wait_until


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
        arbiter.doorbells.arm_all(time.monotonic())
        old_fd = a.metronome.registered_fd
        assert old_fd is not None and b.metronome.registered_fd is not None
        # a's beat fails (a node of its slot is down): its doorbell socket is closed
        arbiter.queue_down(a, time.monotonic(), redis.exceptions.ConnectionError("down"))
        # b reconnects: the lowest free descriptor, a's old one, is what its socket gets
        arbiter.doorbells.unregister(b)
        b.metronome.doorbell.reset()
        arbiter.doorbells.arm_all(time.monotonic())  # raised KeyError: fd already registered
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


def _ring_unread(r: redis.Redis, arbiter: Arbiter) -> None:
    """Park the queue's doorbell, ring it once, and wait until the reply is in its socket
    (not read: the arbiter meets it when it next arms the doorbells)."""
    (rt,) = arbiter.queues.values()
    arbiter.doorbells.arm_all(time.monotonic())
    r.lpush(rt.metronome.keys.wake, "1")  # one job's ring
    _wait_readable(rt.metronome.doorbell.fileno())


def _poked(sock: socket.socket) -> bool:
    """True when the arbiter wrote a poke to this stand-in child (read and consumed)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    return sock.recv(16) == protocol.POKE


def _is_outstanding(r: redis.Redis, bell_client_id: int) -> bool:
    """True once the doorbell's connection is blocked in its pop on the server (the pop
    was written on another connection: the server may run this check before it)."""
    def blocked() -> bool:
        clients = {int(c["id"]): c for c in r.client_list()}
        return "b" in clients[bell_client_id]["flags"]

    wait_until(blocked, 5.0, "the doorbell's pop to block on the server")
    return True


def test_a_quiet_beat_read_outside_the_selector_is_followed_by_a_new_call(
        redis_url: str, queue_name: str) -> None:
    # the parked pop ends on its timeout just after the selector's last look: the loop
    # meets its empty reply when it next arms the doorbells, and must park again before
    # blocking, or a ring admitted meanwhile waits for the loop's 5 s cap
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 1, beat_ms=50) as (arbiter, _):
        (rt,) = arbiter.queues.values()
        bell = rt.metronome.doorbell
        arbiter.doorbells.arm_all(time.monotonic())
        _wait_readable(bell.fileno())  # the empty reply of a quiet beat, not yet read
        arbiter.doorbells.arm_all(time.monotonic())
        assert bell.armed, "the doorbell was left unarmed after its reply was read"
        assert _is_outstanding(r, bell.client_id)


def test_a_ring_read_outside_the_selector_pokes_one_child_and_parks_for_the_next(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        bell = rt.metronome.doorbell
        _ring_unread(r, arbiter)
        arbiter.doorbells.arm_all(time.monotonic())
        states = sorted(c.state for c in rt.children)
        assert states == ["busy", "idle"]  # one job wakes one consumer ...
        assert [_poked(s) for s in theirs].count(True) == 1
        # ... and the other, still idle, is parked on the doorbell for the next one
        assert bell.armed and _is_outstanding(r, bell.client_id)


def test_a_doorbell_with_no_reply_long_past_its_block_is_reconnected(
        redis_url: str, queue_name: str) -> None:
    # a connection that died without a FIN or RST never becomes readable: the arbiter
    # must notice the reply is overdue and park again on a new connection
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, _):
        (rt,) = arbiter.queues.values()
        bell = rt.metronome.doorbell
        arbiter.doorbells.arm_all(time.monotonic())
        old_id = bell.client_id
        # within its one-second block no reply is due yet; the wait is made to look
        # overdue, as it would be on a connection that can no longer deliver one
        bell.armed_at -= bell.beat_s + 6.0
        arbiter.doorbells.arm_all(time.monotonic())
        assert bell.armed and bell.client_id != old_id
        assert rt.metronome.registered_fd == bell.fileno()
        assert _is_outstanding(r, bell.client_id)
        registered = {key.fd for key in arbiter.selector.get_map().values()}
        assert registered == {bell.fileno()}


def test_an_overdue_doorbell_whose_reply_did_come_is_read_not_dropped(
        redis_url: str, queue_name: str) -> None:
    # the loop itself was held up (a paused supervisor): the ring is in the socket and
    # must wake a child, not be thrown away with the connection
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        bell = rt.metronome.doorbell
        _ring_unread(r, arbiter)
        bell.armed_at -= bell.beat_s + 6.0
        arbiter.doorbells.arm_all(time.monotonic())
        assert _poked(theirs[0]) and rt.children[0].state == "busy"


def test_a_ring_whose_poke_cannot_be_delivered_goes_to_an_idle_sibling(
        redis_url: str, queue_name: str) -> None:
    # the child idle longest died idle; its exit is not read yet, so it still counts as
    # idle: the poke its closed pipe refuses must reach the live one
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        dead, live = rt.children
        dead.poked_at, live.poked_at = 1.0, 2.0
        theirs[0].close()
        _ring_unread(r, arbiter)
        arbiter.doorbells.arm_all(time.monotonic())
        assert live.state == "busy" and _poked(theirs[1])


def test_a_child_that_exits_while_poked_passes_its_poke_to_an_idle_sibling(
        redis_url: str, queue_name: str) -> None:
    # poked, it left before answering (a recycle at its job limit, a crash while
    # claiming), holding nothing: the work it was woken for must not wait for its
    # replacement to boot
    with _one_queue_with_idle_children(redis_url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        gone, sibling = rt.children
        assert arbiter.doorbells.poke(rt, gone) and _poked(theirs[0])
        theirs[0].close()
        arbiter.children.on_exit(gone, 4 << 8)  # exited with 4: a recycle, not a crash
        assert sibling.state == "busy" and _poked(theirs[1])


def test_a_stopping_child_that_reports_idle_is_not_poked(
        redis_url: str, queue_name: str) -> None:
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        (child,) = rt.children
        child.state = "stopping"  # told to stop (a roll, a recycle): it finishes and exits
        rt.work_seen = time.monotonic()  # work came after its last poke
        theirs[0].sendall(protocol.idle_line(0, 0))
        _wait_readable(child.sock.fileno())
        arbiter.children.consume_lines(child)
        assert child.state == "stopping" and not _poked(theirs[0])


def test_a_due_schedule_head_pokes_a_child_before_its_promote_returns(
        private_redis: LocalRedis, queue_name: str) -> None:
    # the promote timer fires for a head known to be due: the child is told first, so
    # its claim follows the promote on the server instead of waiting a round trip for its
    # reply; the server is paused (SIGSTOP) so the promote cannot return meanwhile
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis=r)
    with _one_queue_with_idle_children(private_redis.url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        job_id = _due_head(r, q, arbiter)
        private_redis.proc.send_signal(signal.SIGSTOP)
        pump = threading.Thread(target=arbiter._pump, args=(rt, time.monotonic()))
        try:
            pump.start()
            told = select.select(theirs, [], [], 5.0)[0]
            assert told, "no child was told before the promote returned"
            assert pump.is_alive(), "the promote returned from a paused server"
        finally:
            private_redis.proc.send_signal(signal.SIGCONT)
            pump.join(10)
        assert _poked(told[0])
        assert q.get(job_id).state == "waiting"  # type: ignore[union-attr]
        # the promote found the job the told child will claim: it rings no doorbell and
        # no second child is woken
        assert r.llen(rt.metronome.keys.wake) == 0
        assert sorted(c.state for c in rt.children) == ["busy", "idle"]
        assert not any(_poked(s) for s in theirs)


def _told_ahead(r: redis.Redis, q: echomq.Queue, arbiter: Arbiter) -> str:
    """Pump at a delayed job's due time (:func:`_due_head`): the promote goes out with a
    child told meanwhile. Returns the job's id."""
    job_id = _due_head(r, q, arbiter)
    arbiter._pump(arbiter.queues[q.name], time.monotonic())
    return job_id


def _due_head(r: redis.Redis, q: echomq.Queue, arbiter: Arbiter) -> str:
    """Admit a delayed job, let the metronome learn it as the schedule head (and the
    server's clock), and wait until it is due. Returns its id."""
    (rt,) = arbiter.queues.values()
    job_id = q.add("later", {}, delay=0.5)  # the first pump comes before it, even under load
    rt.metronome.pump(time.monotonic(), disarmed=False)
    assert rt.metronome.head_ms is not None, "the job was due before the first promote"
    r.delete(rt.metronome.keys.wake)  # the admit's ring (a new head), read
    head = rt.metronome.head_ms

    def due() -> bool:
        # the metronome takes it for due and the server's clock agrees (under load the
        # offset it estimated can be early by a fraction of a round trip: its promote
        # would then find nothing and the test prove nothing)
        seconds, micros = r.time()
        return rt.metronome.head_due(time.monotonic()) and seconds * 1000 + micros // 1000 >= head

    wait_until(due, 5.0, "the head's due time")
    return job_id


def test_a_told_child_whose_claim_ran_before_the_promote_is_told_again(
        redis_url: str, queue_name: str) -> None:
    # the promote rang no doorbell for the child told while it was on its way; if that
    # child's claim reached the server first it found nothing: its IDLE with no job run
    # gets it poked again, or the promoted job would wait for an unrelated ring
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, theirs):
        (child,) = arbiter.queues[queue_name].children
        job_id = _told_ahead(r, q, arbiter)
        assert q.get(job_id).state == "waiting"  # type: ignore[union-attr]
        assert _poked(theirs[0]) and r.llen(arbiter.queues[queue_name].metronome.keys.wake) == 0
        theirs[0].send(protocol.idle_line(0, 0))  # its claim came back empty
        arbiter.children.on_readable(child)
        assert _poked(theirs[0]), "the told child was left idle beside a claimable job"


def test_a_told_child_claims_once_more_whatever_it_ran_and_then_rests(
        redis_url: str, queue_name: str) -> None:
    # a concurrent child's IDLE counts jobs claimed before or beside the told claim, so a
    # count above 0 does not say that claim came after the promote: one more claim
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, theirs):
        (child,) = arbiter.queues[queue_name].children
        _told_ahead(r, q, arbiter)
        assert _poked(theirs[0])
        theirs[0].send(protocol.idle_line(1, 0))
        arbiter.children.on_readable(child)
        assert _poked(theirs[0]), "a told child reporting a job was left beside the promoted one"
        theirs[0].send(protocol.idle_line(1, 0))  # its next claim came back empty
        arbiter.children.on_readable(child)
        assert child.state == "idle" and not _poked(theirs[0])


def _exit_unheard(arbiter: Arbiter, child: Child, their_end: socket.socket) -> None:
    """The child dies without a word (no IDLE): its end closes and its exit is read."""
    their_end.close()
    arbiter.children.on_exit(child, 0)


def test_a_told_child_that_leaves_unheard_passes_its_poke_to_a_sibling(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r)
    with _one_queue_with_idle_children(redis_url, queue_name, 2) as (arbiter, theirs):
        rt = arbiter.queues[queue_name]
        _told_ahead(r, q, arbiter)
        told = next(i for i, s in enumerate(theirs) if _poked(s))
        _exit_unheard(arbiter, rt.slots[told].child, theirs[told])  # type: ignore[arg-type]
        assert _poked(theirs[1 - told])  # the sibling claims what the told one was woken for
        assert r.llen(rt.metronome.keys.wake) == 0


def test_a_told_child_that_leaves_unheard_with_no_sibling_rings_for_other_replicas(
        redis_url: str, queue_name: str) -> None:
    # the promote it was told for rang nothing: with nobody here to take the poke (no
    # idle sibling, or the supervisor stopping), a ring wakes other replicas' consumers
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, theirs):
        rt = arbiter.queues[queue_name]
        _told_ahead(r, q, arbiter)
        assert _poked(theirs[0]) and r.llen(rt.metronome.keys.wake) == 0
        arbiter.stopping = True  # a SIGTERM came before the child read its poke
        _exit_unheard(arbiter, rt.slots[0].child, theirs[0])  # type: ignore[arg-type]
        assert r.lrange(rt.metronome.keys.wake, 0, -1) == [b"1"]


def test_a_promote_written_ahead_whose_connection_dies_runs_again_and_rings(
        redis_url: str, queue_name: str) -> None:
    # redis-py retries a plain call on a fresh connection, not one written ahead: the
    # metronome runs it again the plain way; the first may have run and rung nothing,
    # so it rings as well
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, theirs):
        rt = arbiter.queues[queue_name]
        job_id = _due_head(r, q, arbiter)

        def cut_the_promote() -> bool:
            # the connection the promote went out on fails before its reply is read
            (conn,) = arbiter.client.connection_pool._in_use_connections
            conn.disconnect()
            return True

        assert rt.metronome.pump(time.monotonic(), disarmed=False, tell=cut_the_promote) \
            or q.get(job_id).state == "waiting"  # type: ignore[union-attr]
        assert q.get(job_id).state == "waiting"  # type: ignore[union-attr]
        assert r.lrange(rt.metronome.keys.wake, 0, -1) == [b"1"]


def test_a_doorbell_the_server_unblocks_with_an_error_takes_the_queue_down_not_the_loop(
        redis_url: str, queue_name: str) -> None:
    # a primary demoted to a replica (or CLIENT UNBLOCK ... ERROR) answers the parked pop
    # with -UNBLOCKED: as a lost connection, not an error out of the supervisor's loop
    r = redis.Redis.from_url(redis_url)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, _):
        rt = arbiter.queues[queue_name]
        bell = rt.metronome.doorbell
        arbiter.doorbells.arm_all(time.monotonic())
        assert _is_outstanding(r, bell.client_id)
        r.execute_command("CLIENT", "UNBLOCK", bell.client_id, "ERROR")
        _wait_readable(bell.fileno())
        arbiter.doorbells.on_ring(rt)
        assert not rt.healthy and not bell.armed


def test_the_loop_never_waits_on_epoll_past_its_deadline() -> None:
    # epoll counts whole milliseconds and CPython rounds a float timeout up twice on the
    # way there: the loop asks for one epoll waits no longer than, then sleeps the rest
    for tenth_ms in range(0, 1000):
        timeout = tenth_ms / 10_000
        asked = whole_ms(timeout)
        assert epoll_ms(asked) <= timeout * 1000, timeout
        assert asked >= timeout - 0.002, timeout


def test_a_promote_whose_told_child_is_gone_rings_the_doorbell(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r)
    with _one_queue_with_idle_children(redis_url, queue_name, 1) as (arbiter, theirs):
        theirs[0].close()  # the only idle child died; its exit is not read yet
        job_id = _told_ahead(r, q, arbiter)
        assert q.get(job_id).state == "waiting"  # type: ignore[union-attr]
        # nobody could be told: the ring the promote left out is rung after it
        assert r.lrange(arbiter.queues[queue_name].metronome.keys.wake, 0, -1) == [b"1"]
