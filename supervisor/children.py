"""The children: what the parent knows about each consumer process, and their lives.

Owns a child's record, its fork (with the fork hygiene: every inherited socket and
sibling's table dropped in the child), the lines it sends over its pipe (READY, IDLE,
OBS, REFUSED, BOOTFAIL), its reaping (``waitpid(-1, WNOHANG)``, unknown children too),
what its exit costs (the hand-back of its jobs, a crash-loop backoff, a poke passed on)
and the end of the drain ladder (SIGKILL what remains). The loop calls :class:`Children`;
the hand-back itself is :mod:`release`'s, the pokes :mod:`doorbells`'.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from echomq.supervisor import protocol
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.logs import event
from echomq.supervisor.signals import sever
from echomq.supervisor.worker import run_child

from echomq.concurrent import max_held
from echomq.config import QueueSettings
from echomq.connection import pools

if TYPE_CHECKING:
    from echomq.supervisor.arbiter import Arbiter
    from echomq.supervisor.runtime import QueueRuntime

log = logging.getLogger("echomq.supervisor")
CRASH_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 30.0  # a child that lived this long was not crash-looping
FORK_RETRY_S = 0.005  # a floor call under way (scheduler thread) delays a fork this long


class BootFailed(Exception):
    """A child could not start (it said BOOTFAIL): respawning would not help."""


@dataclass
class Child:
    """One forked consumer. ``state``: starting → idle ⇄ busy → stopping."""

    queue: str
    slot: int
    pid: int
    sock: socket.socket
    reader: protocol.LineReader
    holdings: Holdings
    claimer: str = ""  # its name in its claims' record (claim.lua), for jobs it never held
    state: str = "starting"
    timed_out: dict[str, float] = field(default_factory=dict)  # job id -> limit it passed
    cancelled: set[str] = field(default_factory=set)  # jobs cancelled while it ran them
    started_at: float = field(default_factory=time.monotonic)
    poked_at: float = 0.0
    # poked while a promote that found work was on its way: its claim may have reached
    # the server first, so its next IDLE gets it poked once more
    told_ahead: bool = False
    stop_sent: bool = False
    respawn_now: bool = False  # a recycle or a roll: its exit is not a crash
    boot_failure: str | None = None  # what it said with BOOTFAIL: respawning would not help
    boot_ended: bool = False  # SIGKILLed for not getting ready within the boot timeout
    can_park: bool = False  # it said READY park: the doorbell can be handed to it
    park_after: float = 0.0  # not handed the doorbell before (silent while it held it)
    parked_seen: float = 0.0  # when it was handed the doorbell, or last said it still parks
    # taken off the doorbell while silent, its claims record not read yet and not heard
    # since: the claim behind its parked pop may have leased a job it has not read
    # (doorbells.py ends it then; leases.py extends that job meanwhile)
    claims_unchecked: bool = False
    jobs: int = 0

    def send(self, message: bytes) -> bool:
        """Write a message to the child's pipe without blocking; False when full or closed."""
        try:
            self.sock.send(message)
            return True
        except (BlockingIOError, OSError):
            return False  # a full or closed pipe: the child is busy or gone; EOF will tell


@dataclass
class Slot:
    """A place for one consumer process; survives the processes that fill it."""

    index: int
    child: Child | None = None
    crashes: int = 0
    respawn_at: float | None = 0.0


def sever_client(client: redis.Redis) -> None:
    """In a child: drop the parent's pooled Redis sockets without closing them for the parent."""
    conns = [c for pool in pools(client) for c in (
        list(getattr(pool, "_available_connections", [])) + list(
            getattr(pool, "_in_use_connections", [])))]
    for conn in conns:
        sever(getattr(conn, "_sock", None))
        conn._sock = None


def fork_child(queue: str, slot: int, redis_url: str, settings: QueueSettings,
               handler: Callable[..., Any], max_jobs: int | None,
               forget: Iterable[Callable[[], None]], floor_url: str | None = None,
               middleware: Sequence[Any] = ()) -> Child:
    """Fork one consumer. In the child, ``forget`` callbacks drop every inherited socket
    (siblings' pipe ends, the signal pipe, the parent's Redis connections, the health
    listener) before the child builds its own clients."""
    parent_end, child_end = socket.socketpair()
    holdings = Holdings(max_held(settings.concurrency, settings.claim_batch))
    claimer = os.urandom(8).hex()
    # what the parent holds at the fork, its garbage included, is never collected in the
    # child: a destructor there (a redis-py PubSub or client handing its connection back
    # to a pool) would take a lock copied as held when a supervisor thread held it, and
    # wait for good before the child said READY (echomq.forksafe unlocks EchoMQ's own
    # pools; this covers any other). No collection runs from here to the child's freeze.
    collecting = gc.isenabled()
    gc.disable()
    try:
        pid = os.fork()
    except BaseException:
        if collecting:
            gc.enable()
        raise
    if pid == 0:  # the child
        gc.freeze()
        if collecting:
            gc.enable()
        try:
            sever(parent_end)
            for callback in forget:
                callback()
        except BaseException:  # never back into the parent's loop with its clients
            log.exception("queue %s: a forked consumer could not let go of the parent's "
                          "resources", queue)
            os._exit(1)
        run_child(child_end, queue, redis_url, settings, handler, max_jobs, floor_url,
                  holdings, claimer, middleware)
    if collecting:
        gc.enable()
    child_end.close()
    parent_end.setblocking(False)
    return Child(queue=queue, slot=slot, pid=pid, sock=parent_end,
                 reader=protocol.LineReader(parent_end.fileno()), holdings=holdings,
                 claimer=claimer)


class Children:
    """Spawns, hears, reaps and stops the consumer processes of every queue."""

    def __init__(self, house: Arbiter) -> None:
        self.house = house
        self.pids: dict[int, Child] = {}  # every live child by pid

    def stop(self, child: Child) -> None:
        """Tell a child to stop after its job (STOP, then SIGTERM); once only."""
        if child.stop_sent:
            return
        child.stop_sent = True
        child.state = "stopping"
        child.send(protocol.STOP)
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def spawn(self, rt: QueueRuntime, slot: Slot) -> None:
        """Fork a consumer into an empty slot and listen to its pipe."""
        house, settings = self.house, self.house.settings
        # no SQLite transaction of the scheduler's may be open across the fork: the child
        # would inherit its lock as held, and its own floor writes would wait in vain
        if house.floor is not None and not house.floor.pause_for_fork():
            slot.respawn_at = time.monotonic() + FORK_RETRY_S
            return
        forget = [*house.forget_in_child, self._sibling_forgetter()]
        try:
            child = fork_child(rt.spec.name, slot.index, settings.redis_url, rt.settings,
                               rt.handler, settings.max_jobs, forget, settings.floor_url,
                               house.middleware)
        finally:
            if house.floor is not None:
                house.floor.resume_after_fork()
        slot.child = child
        slot.respawn_at = None
        self.pids[child.pid] = child
        rt.children_by_fd[child.sock.fileno()] = child
        self.house.selector.register(child.sock.fileno(), selectors.EVENT_READ, child)
        event(log, "spawn", "queue %s: consumer %d started", rt.spec.name, child.pid,
              queue=rt.spec.name, pid=child.pid)

    def end_stuck_boots(self, now: float) -> None:
        """SIGKILL each consumer that has not said READY within the boot timeout (a child
        stuck on something it inherited, or on its handler's set-up, would otherwise stay
        "starting" with no log): it holds no job, and its slot forks again as after a crash."""
        limit = self.house.settings.boot_timeout
        for child in list(self.pids.values()):
            if child.state != "starting" or child.boot_ended or now - child.started_at < limit:
                continue
            child.boot_ended = True
            event(log, "boot-timeout", "queue %s: consumer %d not ready after %.0f s; ending it "
                  "and forking another", child.queue, child.pid, limit, level=logging.WARNING,
                  queue=child.queue, pid=child.pid)
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _sibling_forgetter(self) -> Callable[[], None]:
        """Drop the pipe ends of every child alive now (so a dead child's EOF arrives), and
        the view of their shared tables."""
        socks = [c.sock for c in self.pids.values()]
        tables = [c.holdings for c in self.pids.values()]

        def forget() -> None:
            for sock in socks:
                sever(sock)
            for table in tables:
                table.close()

        return forget

    def on_readable(self, child: Child) -> None:
        """A child's pipe is readable: its lines, or its EOF (then reap)."""
        self.consume_lines(child)
        if child.reader.closed:
            self.unregister(child)
            self.reap()

    def consume_lines(self, child: Child) -> None:
        """Act on what a child said: its observations, IDLE, READY, REFUSED, BOOTFAIL."""
        rt = self.house.queues[child.queue]
        for line in child.reader.read():
            child.claims_unchecked = False  # alive: it reads its own claims' replies
            if line.startswith(protocol.OBS):
                self.house.observed.merge(child.queue, line)
            elif line.startswith(protocol.IDLE):
                child.park_after = 0.0  # alive: it may be handed the doorbell again
                if rt.bell_holder is child:  # a B it read beside a poke was dropped
                    rt.bell_holder = None
                parts = line.split()
                jobs = int(parts[1]) if len(parts) > 1 else 0
                rt.claim_jobs += jobs
                rt.claim_wait_us += int(parts[2]) if len(parts) > 2 else 0
                child.jobs += jobs
                if child.state == "busy":
                    child.state = "idle"
                if jobs:
                    self.slot_of(child).crashes = 0
                # told while a promote was on its way: its claim may have reached the
                # server before the promote (whose ring it stood in for). Its count does
                # not tell (a concurrent child counts jobs claimed before or beside that
                # claim), so it claims once more: an empty claim at worst
                missed = child.told_ahead
                child.told_ahead = False
                if child.state == "idle" and (rt.work_seen >= child.poked_at or missed) \
                        and not self.house.stopping:
                    self.house.doorbells.poke(rt, child)  # work may have come after its last claim
            elif line.startswith((protocol.REFUSED, protocol.BOOTFAIL)):
                self._on_trouble(rt, child, line)
            elif line.startswith((protocol.RUNG, protocol.UNPARKED, protocol.PARKED)):
                self.house.doorbells.heard_from_holder(rt, child, line)
            elif line.split()[:1] == [protocol.READY] and child.state == "starting":
                child.state = "idle"
                child.can_park = line.split()[1:] == [protocol.PARKS]
                if not self.house.stopping:
                    self.house.doorbells.poke(rt, child)

    def unregister(self, child: Child) -> None:
        """Stop listening to a child's pipe."""
        fd = child.sock.fileno()
        if fd >= 0:
            try:
                self.house.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
            self.house.queues[child.queue].children_by_fd.pop(fd, None)

    def reap(self) -> None:
        """waitpid until nothing is left to reap; unknown children are reaped too (PID 1)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                return
            child = self.pids.pop(pid, None)
            if child is not None:
                self.on_exit(child, status)

    def on_exit(self, child: Child, status: int) -> None:
        """A child exited: hand back its jobs, pass on its poke, schedule its respawn (with
        a backoff when it crashes in a loop); a BOOTFAIL stops the supervisor."""
        rt = self.house.queues[child.queue]
        slot = self.slot_of(child)
        # SIGCHLD can be read before the child's last lines. One read takes all a dead
        # child left (a few short lines); no loop, in case a grandchild still holds the
        # other end open.
        if not child.reader.closed:
            self.consume_lines(child)
        self.unregister(child)
        child.sock.close()
        slot.child = None
        if rt.bell_holder is child:  # it died parked on the doorbell
            rt.bell_holder = None
            if not self.house.stopping and rt.healthy:
                self.house.doorbells.take_back(rt)  # a ring its call took, never acted on
        settled_some = child.holdings.dropped() > 0  # got work done: not a crash loop
        released, stalled, landed = self.house.releases.release_child(rt, child)
        # a settle written behind a claim lands before its reply is read: the child died
        # with the reply unread, but the server recorded those outcomes
        settled_some = settled_some or landed > 0
        if child.state == "busy" and not released:
            # it was told to claim and left without saying it found nothing (a recycle, a
            # crash): the work it was woken for goes to a sibling (releases poke on their own)
            rt.work_seen = time.monotonic()
            if self.house.doorbells.poke_idle(rt) is None and child.told_ahead:
                # no sibling here (or stopping) and the promote it stood for rang nothing:
                # ring now, for the consumers of other replicas
                self.house.doorbells.ring(rt)
        if os.WIFSIGNALED(status):
            how, code = f"killed by {signal.Signals(os.WTERMSIG(status)).name}", -1
        else:
            code = os.WEXITSTATUS(status)
            how = f"exited with {code}"
        if child.boot_failure is not None:  # its word, not its exit code: a handler may exit 3
            raise BootFailed(f"queue {child.queue}: consumer could not start "
                             f"({child.boot_failure}); stopping")
        crashed = not (code in (protocol.EXIT_OK, protocol.EXIT_RECYCLE) or child.respawn_now)
        level = logging.WARNING if crashed and not self.house.stopping else logging.INFO
        event(log, "child-exit", "queue %s: consumer %d %s%s", child.queue, child.pid, how,
              f", released {released} job(s)" if released else "", level=level,
              queue=child.queue, pid=child.pid, exit=code, stalled=stalled)
        if self.house.stopping:
            return
        now = time.monotonic()
        rt.restarts += 1
        if crashed:
            if now - child.started_at > STABLE_AFTER_S or settled_some:
                slot.crashes = 0  # it lived long, or settled a batch: not a crash loop
            slot.crashes += 1
            delay = 0.0 if slot.crashes == 1 else min(
                CRASH_BACKOFF_MAX_S, 0.25 * 2 ** (slot.crashes - 2))
        else:
            delay = 0.0
        slot.respawn_at = now + delay
        if delay:
            event(log, "backoff", "queue %s: slot %d crashed %d times in a row; respawn in "
                  "%.2fs", child.queue, slot.index, slot.crashes, delay,
                  queue=child.queue, delay_s=delay, count=slot.crashes)

    def slot_of(self, child: Child) -> Slot:
        """The slot a child fills."""
        return self.house.queues[child.queue].slots[child.slot]

    def kill_all(self) -> None:
        """SIGKILL every child, reap it and requeue its jobs (the end of the drain ladder:
        the arbiter is stopping)."""
        house = self.house
        for child in list(self.pids.values()):
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid, child in list(self.pids.items()):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass  # already reaped
            self.pids.pop(pid, None)
            self.unregister(child)
            slot = self.slot_of(child)
            slot.child = None
            if not child.reader.closed:
                self.consume_lines(child)
            house.releases.release_child(house.queues[child.queue], child, drained=True)
            child.sock.close()

    def _on_trouble(self, rt: QueueRuntime, child: Child, line: str) -> None:
        """A child's REFUSED (the server refused its write) or BOOTFAIL (it cannot start)."""
        word, _, rest = line.partition(" ")
        if word == protocol.BOOTFAIL:
            child.boot_failure = rest or "no reason given"
            return
        code, _, text = rest.partition(" ")
        if rt.healthy or rt.availability.code != code:
            self.house.queue_down(rt, time.monotonic(), code=code or "ERR", detail=text)

