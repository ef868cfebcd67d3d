"""The forked child's loop: wait on the pipe, claim while claims return work, report idle.

A child never blocks on Valkey and never sleeps: between drains it is
blocked in ``recv`` on its socketpair until the parent pokes it.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, NoReturn

from echomq.supervisor import protocol

from echomq import scripts
from echomq.config import QueueSettings
from echomq.connection import NETWORK_ERRORS, client_from_url
from echomq.drain import Drain
from echomq.errors import FloorError
from echomq.floor.writethrough import write_through
from echomq.job import Claimed
from echomq.keys import Keys
from echomq.lanes import Lanes, Outcome
from echomq.runner import Runner
from echomq.scripts import Settled

log = logging.getLogger("echomq.worker")


class Worker:
    """One child process serving one queue."""

    def __init__(self, sock: socket.socket, queue: str, redis_url: str,
                 settings: QueueSettings, handler: Callable[..., Any],
                 max_jobs: int | None, floor_url: str | None = None) -> None:
        self.sock = sock
        self.queue = queue
        self.settings = settings
        self.max_jobs = max_jobs
        self.client = client_from_url(redis_url)
        self.lanes = Lanes(self.client, Keys(queue), settings)
        self.runner = Runner(queue, handler, settings)
        self.stopping = False
        self.jobs_run = 0
        self.report_jobs = 0
        self.report_wait_us = 0
        self.drain = Drain(self.lanes, self.runner, self)
        self.claimed_at = 0.0
        self.floor: Any = None
        if floor_url and settings.durability == "sync":
            from echomq.floor import Floor

            # opened after the fork: an engine's pooled connections must never cross one
            self.floor = Floor.from_url(floor_url, busy_timeout_ms=1000, connect_timeout_s=2)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True  # recorded only; the loop checks it between jobs

    def serve(self) -> int:
        """Run until told to stop; returns the exit code."""
        signal.signal(signal.SIGTERM, self._on_term)
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the parent decides what these mean
        for sig in (signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        scripts.load_all(self.client, self.lanes.keys.prefix)
        self._send(protocol.READY.encode() + b"\n")
        while True:
            try:
                data = self.sock.recv(64)
            except InterruptedError:
                data = b"P"
            if not data or protocol.STOP in data or self.stopping:
                return protocol.EXIT_OK
            if protocol.POKE in data:
                self._drain_safely()
                self._send(protocol.idle_line(self.report_jobs, self.report_wait_us))
                self.report_jobs = self.report_wait_us = 0
            if self.stopping:
                return protocol.EXIT_OK
            if self.max_jobs is not None and self.jobs_run >= self.max_jobs:
                return protocol.EXIT_RECYCLE

    def _drain_safely(self) -> None:
        try:
            self.drain.run()
        except NETWORK_ERRORS as exc:
            # the metronome reconnects and pokes again once the server answers
            log.warning("queue %s: server unreachable while draining: %s", self.queue, exc)

    # --- drain hooks ---------------------------------------------------------------

    def stop_requested(self) -> bool:
        return self.stopping or self._recycle_due()

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        self.claimed_at = time.perf_counter()
        self._send(protocol.hold_line([(c.id, c.token) for c in batch]))

    def on_start(self, claimed: Claimed) -> None:
        self.report_wait_us += int((time.perf_counter() - self.claimed_at) * 1e6)
        self.jobs_run += 1
        self.report_jobs += 1

    def on_unstarted(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Nothing to do: the next HOLD or IDLE line replaces what the parent knows."""

    def after_settle(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        self._write_retries(outcomes, codes)

    def _write_retries(self, outcomes: Sequence[Outcome], codes: Sequence[Settled]) -> None:
        """Durability "sync": a retry is on the floor before the next job starts."""
        if self.floor is None:
            return
        retries = [o.job_id for o, c in zip(outcomes, codes, strict=True)
                   if c is Settled.RETRYING]
        if not retries:
            return
        try:
            write_through(self.client, self.lanes.keys, self.floor, retries)
        except FloorError as exc:  # the scheduler folds them within a beat instead
            log.warning("queue %s: sync write of %d retries failed: %s", self.queue,
                        len(retries), exc)

    def batch_size(self) -> int:
        size = self.runner.batch_size()
        if self.max_jobs is not None:
            size = max(1, min(size, self.max_jobs - self.jobs_run))
        return size

    def _recycle_due(self) -> bool:
        return self.max_jobs is not None and self.jobs_run >= self.max_jobs

    def _send(self, line: bytes) -> None:
        self.sock.sendall(line)


def run_child(sock: socket.socket, queue: str, redis_url: str, settings: QueueSettings,
              handler: Callable[..., Any], max_jobs: int | None,
              floor_url: str | None = None) -> NoReturn:
    """Entry point right after fork: serve, then leave without running the parent's atexit."""
    code = protocol.EXIT_OK
    random.seed()
    try:
        code = Worker(sock, queue, redis_url, settings, handler, max_jobs, floor_url).serve()
    except BaseException:  # the child must never return into the parent's code
        log.exception("queue %s: consumer process failed", queue)
        code = 1
    finally:
        logging.shutdown()
    os._exit(code)
