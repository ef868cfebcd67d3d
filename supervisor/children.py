"""Child records and forking: what the parent knows about each consumer process."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from echomq.supervisor import protocol
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.signals import sever
from echomq.supervisor.worker import run_child

from echomq.concurrent import max_held
from echomq.config import QueueSettings
from echomq.connection import pools


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
    started_at: float = field(default_factory=time.monotonic)
    poked_at: float = 0.0
    # poked while a promote that found work was on its way: its claim may have reached
    # the server first, so its next IDLE gets it poked once more
    told_ahead: bool = False
    stop_sent: bool = False
    respawn_now: bool = False  # a recycle or a roll: its exit is not a crash
    boot_failure: str | None = None  # what it said with BOOTFAIL: respawning would not help
    jobs: int = 0

    def send(self, message: bytes) -> bool:
        """Write a message to the child's pipe without blocking; False when full or closed."""
        try:
            self.sock.send(message)
            return True
        except (BlockingIOError, OSError):
            return False  # a full or closed pipe: the child is busy or gone; EOF will tell


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
               forget: Iterable[Callable[[], None]], floor_url: str | None = None) -> Child:
    """Fork one consumer. In the child, ``forget`` callbacks drop every inherited socket
    (siblings' pipe ends, the signal pipe, the parent's Redis connections, the health
    listener) before the child builds its own clients."""
    parent_end, child_end = socket.socketpair()
    holdings = Holdings(max_held(settings.concurrency, settings.claim_batch))
    claimer = os.urandom(8).hex()
    pid = os.fork()
    if pid == 0:  # the child
        sever(parent_end)
        for callback in forget:
            callback()
        run_child(child_end, queue, redis_url, settings, handler, max_jobs, floor_url,
                  holdings, claimer)
    child_end.close()
    parent_end.setblocking(False)
    return Child(queue=queue, slot=slot, pid=pid, sock=parent_end,
                 reader=protocol.LineReader(parent_end.fileno()), holdings=holdings,
                 claimer=claimer)
