"""A child parked on the doorbell itself: the supervisor hands a queue's doorbell to an
idle consumer that can park (one job at a time in its process), which blocks on it
beside its pipe and claims at the ring, one wake-up from the admit to its claim. The
supervisor parks no call of its own meanwhile (one blocking call per queue), takes the
doorbell back at the ring (RUNG), when the child's call fails (UNPARKED) or when the
child dies (ringing once for the ring its call may have taken), and wakes the child
through the doorbell, not its pipe, when it is the only idle one.

Stand-in children on socketpairs with a real server for the supervisor's side; real
supervisors and forked consumers (a supervisor frozen with SIGSTOP) for the whole."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil
import redis
from echomq.supervisor import protocol
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.children import Child
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.settings import QueueSpec, Settings
from echomq.supervisor.worker import Worker

import echomq
from echomq import scripts
from echomq.config import QueueSettings
from echomq.keys import Keys
from echomq.lanes import Lanes
from echomq.parkclaim import ClaimingDoorbell
from echomq.wake import claim_doorbell

from .conftest import Supervisor, wait_until


@contextmanager
def _arbiter(redis_url: str, queue: str, children: int, can_park: bool = True
             ) -> Iterator[tuple[Arbiter, list[socket.socket]]]:
    """An arbiter for one queue whose slots hold idle stand-in consumers that say they
    can park (what the arbiter writes to them can be read back, what they say fed)."""
    arbiter = Arbiter(Settings(redis_url=redis_url, beat_ms=1000, queues=(
        QueueSpec(name=queue, handler="json:dumps", processes=children),)))
    (rt,) = arbiter.queues.values()
    theirs = []
    for slot in rt.slots:
        ours, their_end = socket.socketpair()
        ours.setblocking(False)
        their_end.setblocking(False)
        theirs.append(their_end)
        slot.child = Child(queue, slot.index, pid=0, sock=ours, state="idle",
                           reader=protocol.LineReader(ours.fileno()), holdings=Holdings(1),
                           can_park=can_park)
    try:
        yield arbiter, theirs
    finally:
        rt.metronome.doorbell.close()
        for s in theirs:
            s.close()


def _said(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64)
    except BlockingIOError:
        return b""


def _hand(arbiter: Arbiter, theirs: list[socket.socket]) -> Child:
    """Arm the queue's doorbell: the first stand-in consumer is handed it (B said)."""
    arbiter.doorbells.arm_all(time.monotonic())
    assert _said(theirs[0]) == protocol.BELL
    (rt,) = arbiter.queues.values()
    child = rt.slots[0].child
    assert child is not None
    return child


def _tell(arbiter: Arbiter, slot: int, line: str, theirs: list[socket.socket]) -> None:
    """A stand-in child says ``line``; the arbiter reads it."""
    (rt,) = arbiter.queues.values()
    child = rt.slots[slot].child
    assert child is not None
    theirs[slot].send(line.encode() + b"\n")
    arbiter.children.consume_lines(child)


def test_the_doorbell_goes_to_an_idle_child_that_can_park_and_the_supervisor_parks_not(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    with _arbiter(redis_url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        arbiter.doorbells.arm_all(time.monotonic())
        assert [_said(s) for s in theirs] == [protocol.BELL, b""]
        assert rt.bell_holder is rt.slots[0].child
        assert not rt.metronome.doorbell.armed
        arbiter.doorbells.arm_all(time.monotonic())  # nothing more while it is held
        assert [_said(s) for s in theirs] == [b"", b""] and not rt.metronome.doorbell.armed
        assert int(r.info("clients")["blocked_clients"]) == 0


def test_children_that_cannot_park_leave_the_doorbell_to_the_supervisor(
        redis_url: str, queue_name: str) -> None:
    with _arbiter(redis_url, queue_name, 2, can_park=False) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        arbiter.doorbells.arm_all(time.monotonic())
        assert [_said(s) for s in theirs] == [b"", b""]
        assert rt.bell_holder is None and rt.metronome.doorbell.armed


def test_a_ring_the_holder_took_hands_the_doorbell_to_the_next_idle_child(
        redis_url: str, queue_name: str) -> None:
    with _arbiter(redis_url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        _hand(arbiter, theirs)
        rings = rt.metronome.rings
        _tell(arbiter, 0, "RUNG w", theirs)
        first = rt.slots[0].child
        assert first is not None and first.state == "busy" and rt.bell_holder is None
        assert rt.metronome.rings == rings + 1
        assert rt.metronome.next_promote == 0.0  # a list token may announce a new head
        arbiter.doorbells.arm_all(time.monotonic())
        assert [_said(s) for s in theirs] == [b"", protocol.BELL]
        assert rt.bell_holder is rt.slots[1].child
        _tell(arbiter, 0, f"{protocol.IDLE} 1 10", theirs)  # its drain ended: no re-poke
        assert first.state == "idle" and _said(theirs[0]) == b""


def test_a_schedule_head_the_holder_popped_sets_the_promote_timer_and_it_stays_parked(
        redis_url: str, queue_name: str) -> None:
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        rt.metronome.server_offset_ms = 0.0  # server ms = monotonic ms, for the check
        rt.metronome.next_promote = float("inf")
        _hand(arbiter, theirs)
        _tell(arbiter, 0, "RUNG d 123456", theirs)
        assert rt.metronome.next_promote == 123.456 and rt.metronome.head_ms == 123456
        assert rt.metronome.doorbell.next_due_ms == 123456  # put back when it stops
        assert rt.bell_holder is rt.slots[0].child and rt.slots[0].child.state == "idle"


def test_a_failed_park_gives_the_doorbell_back(redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        _hand(arbiter, theirs)
        _tell(arbiter, 0, protocol.UNPARKED, theirs)
        assert rt.bell_holder is None
        r.delete(Keys(queue_name).wake)  # its ring again (a test of its own) taken away
        # the metronome parks for a beat (its call meets the outage, if it is one), not
        # the child again at once, which would fail in a loop
        arbiter.doorbells.arm_all(time.monotonic())
        assert _said(theirs[0]) == b"" and rt.metronome.doorbell.armed
        rt.metronome.doorbell.cancel()
        rt.park_after = 0.0  # the beat has passed
        _hand(arbiter, theirs)


def test_a_failed_park_is_not_handed_to_a_sibling_for_a_beat(redis_url: str,
                                                             queue_name: str) -> None:
    """The metronome's own call finds out whether the server is down: a failed park
    leaves the doorbell to it for a beat, not to each idle sibling in turn."""
    r = redis.Redis.from_url(redis_url)
    with _arbiter(redis_url, queue_name, 3) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        arbiter.doorbells.arm_all(time.monotonic())
        assert [_said(s) for s in theirs] == [protocol.BELL, b"", b""]
        _tell(arbiter, 0, protocol.UNPARKED, theirs)
        r.delete(Keys(queue_name).wake)  # its ring again (a test of its own) taken away
        arbiter.doorbells.arm_all(time.monotonic())
        assert [_said(s) for s in theirs] == [b"", b"", b""]
        assert rt.metronome.doorbell.armed and rt.bell_holder is None


def test_work_found_with_only_the_holder_idle_rings_it_instead_of_a_poke(
        redis_url: str, queue_name: str) -> None:
    """A hand-back, a release, a queue back from an outage: the holder is woken through
    the doorbell it parks on (its pipe would end the park); a sibling idle is poked."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(queue_name)
    with _arbiter(redis_url, queue_name, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        _hand(arbiter, theirs)
        arbiter.doorbells.found_work(rt, time.monotonic())
        assert [_said(s) for s in theirs] == [b"", protocol.POKE]  # the sibling
        r.delete(keys.wake)
        arbiter.doorbells.found_work(rt, time.monotonic())  # only the holder idle now
        assert [_said(s) for s in theirs] == [b"", b""]
        assert r.lrange(keys.wake, 0, -1) == [b"1"]
        assert rt.bell_holder is rt.slots[0].child


def test_a_promote_with_only_the_holder_idle_rings_from_the_server(
        redis_url: str, queue_name: str) -> None:
    """A due head's promote tells no child while the holder is the only idle one (the
    pipe would end its park): the promote script rings the doorbell it parks on."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(queue_name)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        _hand(arbiter, theirs)
        q.add("x", {}, delay=0.05)
        r.delete(keys.wake)
        wait_until(lambda: float(r.zrange(keys.schedule, 0, 0, withscores=True)[0][1])
                   <= float(r.time()[0]) * 1000 + r.time()[1] / 1000, 5, "the job due")
        rt.metronome.head_ms = 0.0
        rt.metronome.server_offset_ms = 0.0
        rt.metronome.next_promote = 0.0
        arbiter._pump(rt, time.monotonic())
        assert _said(theirs[0]) == b""
        assert r.lrange(keys.wake, 0, -1) == [b"1"] and r.zcard(keys.schedule) == 0
    q.close()


def test_a_holder_that_dies_has_the_doorbell_rung_once_and_taken_back(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    keys = Keys(queue_name)
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        child = _hand(arbiter, theirs)
        r.delete(keys.wake)
        arbiter.children.on_exit(child, 9)  # killed by SIGKILL while parked
        assert rt.bell_holder is None
        assert r.lrange(keys.wake, 0, -1) == [b"1"]


def _blpop_ports(r: redis.Redis) -> list[int]:
    """The client ports of the connections blocked in BLPOP."""
    return [int(c["addr"].rsplit(":", 1)[1]) for c in r.client_list()
            if c.get("cmd") == "blpop" and "b" in c.get("flags", "")]


def _owner(pids: list[int], port: int) -> int | None:
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.laddr and c.laddr.port == port for c in conns):
            return pid
    return None


def test_a_parked_consumer_runs_a_job_while_its_supervisor_is_frozen(
        private_redis: LocalRedis, queue_name: str, supervisor: Callable[..., Supervisor]
        ) -> None:
    """The consumer, not the supervisor, is blocked on the doorbell: with the supervisor
    stopped (SIGSTOP) a job admitted is claimed and run all the same."""
    redis_url = private_redis.url  # a server of its own: every BLPOP on it is this test's
    r = redis.Redis.from_url(redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--beat-ms", "100").started(1)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("record", {"n": 0})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:done") == 1, 10, "the first job")
    (child,) = psutil.Process(sup.proc.pid).children()

    def child_parked() -> bool:
        owners = [_owner([child.pid, sup.proc.pid], p)
                  for p in _blpop_ports(r)]
        return owners == [child.pid]

    wait_until(child_parked, 10, "the consumer parked on the doorbell, and nobody else")
    os.kill(sup.proc.pid, signal.SIGSTOP)
    try:
        q.add("record", {"n": 1})
        wait_until(lambda: r.llen(f"ledger:{queue_name}:done") == 2, 10,
                   "the job run with the supervisor frozen")
    finally:
        os.kill(sup.proc.pid, signal.SIGCONT)
    q.close()


def test_an_idle_from_the_holder_gives_the_doorbell_back(redis_url: str, queue_name: str
                                                         ) -> None:
    """A child says IDLE only after a drain, which a park never outlives: a B it read
    beside a poke (and dropped) leaves no holder that parks nothing."""
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        child = _hand(arbiter, theirs)
        child.poked_at = time.monotonic()  # no work seen since: its IDLE is not re-poked
        _tell(arbiter, 0, f"{protocol.IDLE} 0 0", theirs)
        assert rt.bell_holder is None and _said(theirs[0]) == b""
        arbiter.doorbells.arm_all(time.monotonic())
        assert _said(theirs[0]) == protocol.BELL  # handed again, for real this time


def test_a_silent_holder_is_taken_the_doorbell_and_a_thawed_one_is_poked_off_it(
        redis_url: str, queue_name: str) -> None:
    """A holder that says nothing for two of its calls' blocks (frozen, swapped out) is
    taken the doorbell from, which is rung once (a ring its call may have taken), and is
    not handed it again until it speaks; when it thaws and says it still parks, a poke
    ends that park."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(queue_name)
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        child = _hand(arbiter, theirs)
        deadline = arbiter.doorbells.holder_deadline(rt)
        assert deadline is not None and deadline == child.parked_seen + 2 * 5.0 + 5.0
        _tell(arbiter, 0, protocol.PARKED, theirs)  # alive: its deadline moves on
        assert (arbiter.doorbells.holder_deadline(rt) or 0) > deadline
        r.delete(keys.wake)
        arbiter.doorbells.watch_holder(rt, time.monotonic() + 100)
        assert rt.bell_holder is None and r.lrange(keys.wake, 0, -1) == [b"1"]
        r.delete(keys.wake)
        arbiter.doorbells.arm_all(time.monotonic())  # the metronome parks, not the child
        assert _said(theirs[0]) == b"" and rt.metronome.doorbell.armed
        _tell(arbiter, 0, protocol.PARKED, theirs)  # thawed, still in its park
        assert _said(theirs[0]) == protocol.POKE and child.state == "busy"


@contextmanager
def _worker(redis_url: str, queue: str, doorbell: str = "list"
            ) -> Iterator[tuple[socket.socket, Worker, list[int]]]:
    """A real consumer's loop (the forked child's) in a thread, on a socketpair."""
    settings = QueueSettings(beat_ms=100, doorbell=doorbell)
    scripts.load_all(redis.Redis.from_url(redis_url), Keys(queue).prefix)  # as its boot does
    parent_end, child_end = socket.socketpair()
    worker = Worker(child_end, queue, redis_url, settings, lambda job: job.payload, None)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.serve()), daemon=True)
    thread.start()
    lines = _Lines(parent_end)
    assert lines.next() == f"{protocol.READY} {protocol.PARKS}"
    try:
        yield parent_end, worker, codes
    finally:
        try:
            parent_end.send(protocol.STOP)
        except OSError:
            pass
        thread.join(10)
        worker.holdings.close()
        parent_end.close()
        child_end.close()


class _Lines:
    """The lines a consumer writes on its pipe, read with a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def next(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(4096)
            assert chunk, "the consumer closed its pipe"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def until(self, prefix: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(0.01, deadline - time.monotonic()))
            if line.startswith(prefix):
                return line


def _stop_at_rung(worker: Worker) -> None:
    """SIGTERM lands as the consumer says RUNG w: its handler's record, at that instant."""
    real_send = worker._send

    def send(line: bytes) -> None:
        if line.startswith(b"RUNG w"):
            worker.stopping = True
        real_send(line)

    worker._send = send  # type: ignore[method-assign]


def _blocked(r: redis.Redis) -> int:
    return int(r.info("clients")["blocked_clients"])


def test_a_real_consumer_parks_claims_at_the_ring_and_says_it_still_parks(
        private_redis: LocalRedis, queue_name: str) -> None:
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    with _worker(private_redis.url, queue_name) as (pipe, _worker_, _):
        lines = _Lines(pipe)
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        assert lines.until(protocol.PARKED, 5) == protocol.PARKED  # its 0.5 s block ran out
        jid = q.add("x", {"v": 7})
        assert lines.next() == "RUNG w"
        assert lines.until(protocol.IDLE).split()[:2] == [protocol.IDLE, "1"]
        assert q.get(jid).state == "completed"
        assert _blocked(r) == 0  # it claims and rests: the doorbell is the parent's again
    q.close()


def test_a_poke_ends_the_park_and_cancels_its_call(private_redis: LocalRedis,
                                                   queue_name: str) -> None:
    r = redis.Redis.from_url(private_redis.url)
    with _worker(private_redis.url, queue_name) as (pipe, _worker_, _):
        lines = _Lines(pipe)
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        pipe.send(protocol.POKE)
        assert lines.until(protocol.IDLE).startswith(protocol.IDLE)
        assert _blocked(r) == 0  # no call of its own left blocked beside the parent's


def test_a_park_whose_connection_is_killed_says_unparked(private_redis: LocalRedis,
                                                         queue_name: str) -> None:
    r = redis.Redis.from_url(private_redis.url)
    with _worker(private_redis.url, queue_name) as (pipe, _worker_, _):
        lines = _Lines(pipe)
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        r.client_kill_filter(_type="normal", skipme=True)
        assert lines.until(protocol.UNPARKED) == protocol.UNPARKED


def test_a_stopping_consumer_rings_again_for_a_ring_it_took(private_redis: LocalRedis,
                                                            queue_name: str) -> None:
    """SIGTERM reached the parked consumer before its parent's stop: a ring its call took,
    whose claim behind the pop did not run (the server lost its scripts), is rung again for
    the others as it leaves, not claimed and not lost."""
    r = redis.Redis.from_url(private_redis.url)
    keys = Keys(queue_name)
    with _worker(private_redis.url, queue_name) as (pipe, worker, codes):
        r.script_flush()
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        worker.stopping = True  # what its SIGTERM handler records
        r.lpush(keys.wake, "1")
        wait_until(lambda: codes == [protocol.EXIT_OK], 10, "the consumer to leave")
        assert r.lrange(keys.wake, 0, -1) == [b"1"]


def test_a_schedule_head_the_consumer_popped_is_said_and_put_back_when_it_leaves(
        private_redis: LocalRedis, queue_name: str) -> None:
    r = redis.Redis.from_url(private_redis.url)
    keys = Keys(queue_name)
    with _worker(private_redis.url, queue_name, doorbell="marker") as (pipe, _worker_, codes):
        lines = _Lines(pipe)
        claim_doorbell(r, keys, "marker")
        r.delete(keys.marker)
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        due = (int(r.time()[0]) + 60) * 1000
        r.zadd(keys.marker, {"1": due})
        assert lines.until(protocol.RUNG) == f"RUNG d {due}"
        assert r.zcard(keys.marker) == 0
        pipe.send(protocol.STOP)
        wait_until(lambda: codes == [protocol.EXIT_OK], 10, "the consumer to leave")
        assert r.zrange(keys.marker, 0, -1, withscores=True) == [(b"1", float(due))]


def test_a_frozen_holder_does_not_keep_the_queue_s_jobs_waiting(
        private_redis: LocalRedis, queue_name: str, supervisor: Callable[..., Supervisor]
        ) -> None:
    """The consumer parked on the doorbell is frozen (SIGSTOP), and the server runs the
    claim behind its pop at the next ring: the job is leased to a process that cannot run
    it. Its supervisor takes the doorbell back once it has been silent for two of its
    calls' blocks, finds the job leased unseen, ends that consumer (its exit hands the
    job back uncharged), and the other consumer runs every job, each once."""
    redis_url = private_redis.url
    r = redis.Redis.from_url(redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "2", "--beat-ms", "100").started(2)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("record", {"n": 0})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:done") == 1, 10, "the first job")
    pids = [c.pid for c in psutil.Process(sup.proc.pid).children()]

    def holder() -> int | None:
        owners = [_owner(pids + [sup.proc.pid], p) for p in _blpop_ports(r)]
        return owners[0] if len(owners) == 1 and owners[0] in pids else None

    wait_until(lambda: holder() is not None, 10, "a consumer parked on the doorbell")
    frozen = holder()
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)
    try:
        jids = [q.add("record", {"n": n}) for n in range(1, 4)]
        # the frozen consumer's pop took the first ring, and its claim leased that job
        wait_until(lambda: r.hget(f"emq:{{{queue_name}}}:job:{jids[0]}", "state") == b"active",
                   10, "the first job leased by the claim behind the frozen pop")
        wait_until(lambda: r.llen(f"ledger:{queue_name}:done") == 4, 20,
                   "the jobs run by the consumer not frozen")
        sup.wait_for_log("doorbell-holder-silent|said nothing for")
        sup.wait_for_log("doorbell-holder-ended|leased a job it has not read")
        wait_until(lambda: not psutil.pid_exists(frozen)
                   or psutil.Process(frozen).status() == psutil.STATUS_ZOMBIE, 10,
                   "the frozen consumer ended")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGCONT)
    started = [x.decode().split(":") for x in r.lrange(f"ledger:{queue_name}:started", 0, -1)]
    runs = [(jid, attempts) for jid, _pid, attempts in started if jid in jids]
    assert sorted(runs) == sorted((jid, "1") for jid in jids)  # each once, uncharged
    q.close()


def test_a_second_bell_while_parked_keeps_the_park(private_redis: LocalRedis,
                                                   queue_name: str) -> None:
    """A B read while parked (the parent handed the doorbell again after an IDLE that
    raced the first B) changes nothing: the consumer parks on and claims at the ring."""
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    with _worker(private_redis.url, queue_name) as (pipe, _worker_, _):
        lines = _Lines(pipe)
        pipe.send(protocol.BELL)
        assert lines.until(protocol.PARKED, 5) == protocol.PARKED
        pipe.send(protocol.BELL)
        # its next PARKED comes after it read that B (the pipe wakes its wait at once);
        # its blocking call reaches the server a moment after it says so
        assert lines.until(protocol.PARKED, 5) == protocol.PARKED
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked on")
        jid = q.add("x", {"v": 1})
        assert lines.next() == "RUNG w"
        assert lines.until(protocol.IDLE).split()[:2] == [protocol.IDLE, "1"]
        assert q.get(jid).state == "completed"
    q.close()


def test_a_message_other_than_a_poke_that_ends_the_park_says_unparked(
        private_redis: LocalRedis, queue_name: str) -> None:
    """The parent counts a child parked until it hears otherwise: a park ended by anything
    but a poke (which the parent sent knowing) is said."""
    r = redis.Redis.from_url(private_redis.url)
    with _worker(private_redis.url, queue_name) as (pipe, _worker_, _):
        lines = _Lines(pipe)
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        pipe.send(protocol.CANCEL)
        assert lines.until(protocol.UNPARKED, 5) == protocol.UNPARKED
        assert _blocked(r) == 0


def test_a_stop_right_after_the_parked_call_took_a_ring_rings_again(
        private_redis: LocalRedis, queue_name: str) -> None:
    """SIGTERM lands after the parked call took a ring and said RUNG, before the consumer
    claims, and the claim behind the pop did not run (the server had lost its scripts):
    it leaves without claiming, and the ring is rung again for the others. Had the claim
    run, it would have taken the ring's work (nothing here): no ring is left then."""
    r = redis.Redis.from_url(private_redis.url)
    keys = Keys(queue_name)
    for claim_runs in (False, True):
        with _worker(private_redis.url, queue_name) as (pipe, worker, codes):
            _stop_at_rung(worker)
            if not claim_runs:
                r.script_flush()
            pipe.send(protocol.BELL)
            wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
            r.lpush(keys.wake, "1")
            wait_until(lambda: codes == [protocol.EXIT_OK], 10, "the consumer to leave")
            assert r.lrange(keys.wake, 0, -1) == ([] if claim_runs else [b"1"])
            r.delete(keys.wake)


def test_a_thawed_child_already_poked_is_not_poked_twice(redis_url: str,
                                                         queue_name: str) -> None:
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        child = _hand(arbiter, theirs)
        assert arbiter.doorbells.poke(rt, child)  # e.g. every idle child after an outage
        assert _said(theirs[0]) == protocol.POKE and rt.bell_holder is None
        _tell(arbiter, 0, protocol.PARKED, theirs)  # said before it read the poke
        assert _said(theirs[0]) == b"" and child.state == "busy"


def test_a_failed_park_rings_once_for_a_ring_its_call_may_have_taken(
        redis_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(redis_url)
    keys = Keys(queue_name)
    with _arbiter(redis_url, queue_name, 1) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        _hand(arbiter, theirs)
        r.delete(keys.wake)
        rt.metronome.next_promote = float("inf")
        _tell(arbiter, 0, protocol.UNPARKED, theirs)
        assert r.lrange(keys.wake, 0, -1) == [b"1"] and rt.metronome.next_promote == 0.0


def _marker_head_taken_by_the_holder(redis_url: str, queue_name: str,
                                     lose: Callable[[Arbiter, Child], None]) -> None:
    """The marker doorbell: a new schedule head's marker is taken by the holder's call,
    which never says it (it dies, or freezes and is taken the doorbell from). The job is
    promoted when due, not at the next safety promote (30 beats out)."""
    r = redis.Redis.from_url(redis_url)
    arbiter = Arbiter(Settings(redis_url=redis_url, beat_ms=1000, doorbell="marker", queues=(
        QueueSpec(name=queue_name, handler="json:dumps", processes=1),)))
    (rt,) = arbiter.queues.values()
    arbiter._declare_queue(rt)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    child = Child(queue_name, 0, pid=0, sock=ours, state="idle",
                  reader=protocol.LineReader(ours.fileno()), holdings=Holdings(1),
                  can_park=True)
    rt.slots[0].child = child
    q = echomq.Queue(queue_name, redis_url=redis_url)
    try:
        rt.metronome.next_promote = rt.metronome.next_reap = 0.0
        arbiter._pump(rt, time.monotonic())  # a quiet beat: the timer goes 30 beats out
        assert rt.metronome.next_promote > time.monotonic() + 10
        r.delete(rt.metronome.keys.marker)
        arbiter.doorbells.arm_all(time.monotonic())
        assert rt.bell_holder is child and theirs.recv(10) == protocol.BELL
        jid = q.add("x", {}, delay=0.5)  # a new head: its marker, scored by its due time
        assert r.zpopmin(rt.metronome.keys.marker)  # what the holder's call took
        lose(arbiter, child)
        wait_until(lambda: (arbiter._pump(rt, time.monotonic()),
                            q.get(jid).state == "waiting")[1], 5, "the job promoted when due")
    finally:
        rt.metronome.doorbell.close()
        theirs.close()
        q.close()


def test_a_schedule_head_a_dead_holder_took_is_promoted_when_due(
        redis_url: str, queue_name: str) -> None:
    def die(arbiter: Arbiter, child: Child) -> None:
        arbiter.children.on_exit(child, 9)  # SIGKILLed before it said RUNG d

    _marker_head_taken_by_the_holder(redis_url, queue_name, die)


def test_a_schedule_head_a_frozen_holder_took_is_promoted_when_due(
        redis_url: str, queue_name: str) -> None:
    def freeze(arbiter: Arbiter, child: Child) -> None:
        (rt,) = arbiter.queues.values()
        arbiter.doorbells.watch_holder(rt, time.monotonic() + 100)  # silent: taken back
        assert rt.bell_holder is None

    _marker_head_taken_by_the_holder(redis_url, queue_name, freeze)


def test_the_claim_behind_the_parked_pop_leases_the_job_at_the_ring(
        private_redis: LocalRedis, queue_name: str) -> None:
    """One wake-up: by the time the consumer says RUNG, the claim written behind its pop
    has leased the job on the server; it runs it once, with no claim of its own first."""
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    keys = Keys(queue_name)
    jid = "behind-1"
    with _worker(private_redis.url, queue_name) as (pipe, worker, _):
        lines = _Lines(pipe)
        states: list[bytes | None] = []
        real_send = worker._send

        def send(line: bytes) -> None:
            if line.startswith(b"RUNG w"):
                states.append(r.hget(keys.job(jid), "state"))
            real_send(line)

        worker._send = send  # type: ignore[method-assign]
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        q.add("x", {"v": 7}, job_id=jid)
        assert lines.until("RUNG w") == "RUNG w"
        assert lines.until(protocol.IDLE).split()[:2] == [protocol.IDLE, "1"]
        assert states == [b"active"]
        job = q.get(jid)
        assert job is not None and job.state == "completed" and job.attempts == 1
    q.close()


def test_a_stop_after_the_claim_behind_the_pop_leased_a_job_hands_it_back_uncharged(
        private_redis: LocalRedis, queue_name: str) -> None:
    """SIGTERM lands as the parked call takes a ring whose claim leased a job: the
    consumer leaves without running it, and the job is back on its lane, uncharged."""
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    keys = Keys(queue_name)
    with _worker(private_redis.url, queue_name) as (pipe, worker, codes):
        _stop_at_rung(worker)
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        jid = q.add("x", {"v": 1})
        wait_until(lambda: codes == [protocol.EXIT_OK], 10, "the consumer to leave")
        job = q.get(jid)
        assert job is not None and job.state == "waiting" and job.attempts == 0
        assert r.lrange(keys.lane("default"), 0, -1) == [jid.encode()]
        assert r.llen(keys.wake) >= 1  # rung again for the others
    q.close()


def test_a_claim_reply_lost_with_the_parked_connection_is_handed_back_and_run_once(
        private_redis: LocalRedis, queue_name: str) -> None:
    """The server ran the claim behind the pop, and the connection failed before its reply
    was read: the consumer says UNPARKED and drains at once, without a poke: it hands back
    what its claims record names beyond what it holds, then runs the job once, uncharged
    for the loss."""
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    with _worker(private_redis.url, queue_name) as (pipe, worker, _):
        worker.lanes.claimer = "c-lost"  # a supervised consumer's claims record
        lines = _Lines(pipe)
        bell = worker._bell()
        assert isinstance(bell, ClaimingDoorbell)
        bell.claim = worker.lanes.claim_call(1, chain=True)  # with the record, as forked
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        real_read = bell.conn.read_response
        reads: list[int] = []

        def read_response(*args: object, **kwargs: object) -> object:
            reply = real_read(*args, **kwargs)
            reads.append(1)
            if len(reads) == 2:  # the claim's reply: the server ran it, the reply is lost
                raise redis.exceptions.ConnectionError("connection lost")
            return reply

        bell.conn.read_response = read_response  # type: ignore[method-assign]
        jid = q.add("x", {"v": 1})
        assert lines.until(protocol.UNPARKED) == protocol.UNPARKED
        # no poke: it drains at once, so the job does not wait for a ring or its lease,
        # and says so (busy for the parent, which extends its leases meanwhile)
        assert lines.until(protocol.RUNG) == "RUNG w"
        assert lines.until(protocol.IDLE).split()[:2] == [protocol.IDLE, "1"]
        job = q.get(jid)
        assert job is not None and job.state == "completed" and job.attempts == 1
    q.close()


@contextmanager
def _silent_holder_with_a_leased_job(redis_url: str, queue: str
                                     ) -> Iterator[tuple[Arbiter, Child, list[socket.socket],
                                                         subprocess.Popen[bytes], str]]:
    """A stand-in holder (a real process that does nothing) whose claims record names a
    job leased to it that it never read: what a claim behind its parked pop leaves when
    it froze."""
    q = echomq.Queue(queue, redis_url=redis_url)
    with _arbiter(redis_url, queue, 2) as (arbiter, theirs):
        (rt,) = arbiter.queues.values()
        proc = subprocess.Popen(["sleep", "60"])
        try:
            child = _hand(arbiter, theirs)
            child.pid, child.claimer = proc.pid, "c-frozen"
            jid = q.add("x", {})
            # leased for a second: an extension by the arbiter (its lease is the default) is
            # seen at once on the score
            lanes = Lanes(redis.Redis.from_url(redis_url), Keys(queue),
                          QueueSettings(lease_ms=1000))
            lanes.claimer = child.claimer
            assert [c.id for c in lanes.claim(1)] == [jid]
            yield arbiter, child, theirs, proc, jid
        finally:
            proc.kill()
            proc.wait()
    q.close()


def _watch_while_the_server_is_frozen(arbiter: Arbiter, server: LocalRedis) -> None:
    """The holder's deadline passes while the server is frozen (SIGSTOP): the arbiter's
    calls time out (half a second each), then the server runs again."""
    (rt,) = arbiter.queues.values()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        arbiter.client.connection_pool.disconnect()
        arbiter.client.connection_pool.connection_kwargs["socket_timeout"] = 0.5
        arbiter.doorbells.watch_holder(rt, time.monotonic() + 100)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def test_a_silent_holder_with_a_job_leased_unread_is_ended_as_no_crash(
        redis_url: str, queue_name: str) -> None:
    with _silent_holder_with_a_leased_job(redis_url, queue_name) as (arbiter, child, _, proc,
                                                                      _jid):
        (rt,) = arbiter.queues.values()
        arbiter.doorbells.watch_holder(rt, time.monotonic() + 100)
        assert proc.wait(10) == -signal.SIGKILL
        assert child.respawn_now and not child.claims_unchecked


def test_a_silent_holder_that_speaks_as_it_is_taken_off_is_not_ended(
        redis_url: str, queue_name: str) -> None:
    """It thawed at its deadline: what it said is read first, and it reads its claim's
    reply itself."""
    with _silent_holder_with_a_leased_job(redis_url, queue_name) as (arbiter, child, theirs,
                                                                      proc, _jid):
        (rt,) = arbiter.queues.values()
        theirs[0].send(b"RUNG w\n")  # written, not read yet by the arbiter
        arbiter.doorbells.watch_holder(rt, time.monotonic() + 100)
        assert proc.poll() is None and not child.respawn_now
        assert child.state == "busy" and not child.claims_unchecked


def test_a_silent_holder_checked_while_the_server_is_away_keeps_its_leases_and_is_ended_later(
        queue_name: str) -> None:
    """The server does not answer when the holder's deadline passes: its job's lease is
    extended meanwhile (not reaped as a stall under a frozen process), and the lease pass
    asks again once the queue is up, which ends it."""
    server = LocalRedis().start()
    try:
        with _silent_holder_with_a_leased_job(server.url, queue_name) as (
                arbiter, child, _, proc, jid):
            (rt,) = arbiter.queues.values()
            r = redis.Redis.from_url(server.url)
            leased_until = r.zscore(Keys(queue_name).leases, jid)
            _watch_while_the_server_is_frozen(arbiter, server)
            assert proc.poll() is None and child.claims_unchecked
            assert not rt.healthy  # its take-back's ring failed too: the queue is down
            arbiter.leases.extend(time.monotonic())  # no check while down; extended
            assert (r.zscore(Keys(queue_name).leases, jid) or 0) > (leased_until or 0)
            assert proc.poll() is None and child.claims_unchecked
            assert rt.availability.up()  # the probe's answer
            arbiter.leases.extend(time.monotonic())  # the lease pass asks again
            assert proc.wait(10) == -signal.SIGKILL and not child.claims_unchecked
    finally:
        server.stop()


def test_the_jobs_a_parked_holder_s_claim_leased_unread_have_their_leases_extended(
        redis_url: str, queue_name: str) -> None:
    """An idle child has read every claim's reply, but a parked one's claim leases at the
    ring before it reads: once it is silent past its block (it says it still parks at each
    block's end), the job its newest claim leased is extended too, so a lease shorter than
    its silence deadline does not run out under a frozen holder. A holder that speaks
    costs the lease pass nothing."""
    r = redis.Redis.from_url(redis_url)
    with _silent_holder_with_a_leased_job(redis_url, queue_name) as (arbiter, child, _, _p,
                                                                      jid):
        (rt,) = arbiter.queues.values()
        assert rt.bell_holder is child and child.state == "idle"
        leased_until = r.zscore(Keys(queue_name).leases, jid) or 0
        r.config_resetstat()
        arbiter.leases.extend(time.monotonic())  # it said it parks within its block
        assert r.zscore(Keys(queue_name).leases, jid) == leased_until
        assert "cmdstat_lrange" not in r.info("commandstats")  # no idle cost
        child.parked_seen -= rt.metronome.doorbell.beat_s + 1  # silent past its block
        arbiter.leases.extend(time.monotonic())
        assert (r.zscore(Keys(queue_name).leases, jid) or 0) > leased_until


def test_a_schedule_head_popped_with_a_job_the_claim_leased_is_still_said(
        private_redis: LocalRedis, queue_name: str) -> None:
    """Marker doorbell: the pop takes a schedule head's marker while a job waits (its own
    ring was taken by a busy sibling's claim), and the claim behind the pop leases that
    job. The consumer runs it, and says the head's due time first, so the parent's
    promote timer learns it."""
    r = redis.Redis.from_url(private_redis.url)
    keys = Keys(queue_name)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    with _worker(private_redis.url, queue_name, doorbell="marker") as (pipe, _worker_, _):
        lines = _Lines(pipe)
        claim_doorbell(r, keys, "marker")
        jid = q.add("x", {"v": 1})
        r.delete(keys.marker)  # its ring, taken by another consumer's claim
        pipe.send(protocol.BELL)
        wait_until(lambda: _blocked(r) == 1, 10, "the consumer parked")
        due = (int(r.time()[0]) + 60) * 1000
        r.zadd(keys.marker, {"1": due})
        assert lines.until(protocol.RUNG) == f"RUNG d {due}"
        assert lines.next() == "RUNG w"
        assert lines.until(protocol.IDLE).split()[:2] == [protocol.IDLE, "1"]
        job = q.get(jid)
        assert job is not None and job.state == "completed"
    q.close()


def test_a_silent_holder_heard_from_after_a_check_the_server_missed_is_not_ended(
        queue_name: str) -> None:
    """The check at its deadline found the server away; the consumer then thawed and spoke
    (it reads its claim's reply itself, and its next claim may well be unread for a moment):
    the lease pass's later check does not end a working consumer."""
    server = LocalRedis().start()
    try:
        with _silent_holder_with_a_leased_job(server.url, queue_name) as (
                arbiter, child, theirs, proc, _jid):
            (rt,) = arbiter.queues.values()
            _watch_while_the_server_is_frozen(arbiter, server)
            assert child.claims_unchecked
            _tell(arbiter, 0, "RUNG w", theirs)  # thawed: it runs the job its claim leased
            assert rt.availability.up()
            arbiter.leases.extend(time.monotonic())
            assert proc.poll() is None and not child.claims_unchecked and not child.respawn_now
    finally:
        server.stop()


def test_a_silent_holder_that_speaks_while_its_claims_are_read_is_not_ended(
        redis_url: str, queue_name: str) -> None:
    """It thaws during the parent's read of its claims record (forced here: it speaks from
    inside that read): what it said is read again before the kill, and it is spared."""
    with _silent_holder_with_a_leased_job(redis_url, queue_name) as (arbiter, child, theirs,
                                                                      proc, _jid):
        (rt,) = arbiter.queues.values()
        real = arbiter.doorbells._leased_unseen

        def leased_unseen(rt_: object, child_: Child) -> bool:
            found = real(rt_, child_)  # type: ignore[arg-type]
            theirs[0].send(b"RUNG w\n")
            return found

        arbiter.doorbells._leased_unseen = leased_unseen  # type: ignore[method-assign]
        arbiter.doorbells.watch_holder(rt, time.monotonic() + 100)
        assert proc.poll() is None and not child.respawn_now and child.state == "busy"
