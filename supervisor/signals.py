"""Signals as bytes on a socket: handlers record nothing and do nothing.

``signal.set_wakeup_fd`` writes each arriving signal's number to a
socketpair that sits in the main loop's selector; the loop reads the numbers
and acts. The Python-level handlers are empty: they exist only so the
signals no longer kill the process.

SIGUSR2 prints the stack of every thread to stderr (``faulthandler``, in C: it works
while the process is stuck in a call), in the supervisor and in each consumer, which
inherit it across the fork: ``kill -USR2 <pid>`` tells where a process waits.
"""

from __future__ import annotations

import faulthandler
import signal
import socket
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1)
DUMP_STACKS = signal.SIGUSR2


def _record(signum: int, frame: FrameType | None) -> None:
    """Nothing to do: set_wakeup_fd has already written the signal number."""


class SignalPipe:
    """Install the empty handlers and expose the read end for a selector."""

    def __init__(self) -> None:
        self.reader, self.writer = socket.socketpair()
        self.reader.setblocking(False)
        self.writer.setblocking(False)
        self.previous_fd = signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
        for sig in HANDLED:
            signal.signal(sig, _record)
        faulthandler.register(DUMP_STACKS, all_threads=True)

    def fileno(self) -> int:
        """The read end the selector waits on."""
        return self.reader.fileno()

    def read(self) -> list[int]:
        """Signal numbers received since the last read, in order."""
        out: list[int] = []
        while True:
            try:
                data = self.reader.recv(4096)
            except BlockingIOError:
                return out
            if not data:
                return out
            out.extend(data)

    def close(self) -> None:
        """Restore the default handlers and close the pipe."""
        signal.set_wakeup_fd(self.previous_fd)
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        faulthandler.unregister(DUMP_STACKS)
        self.reader.close()
        self.writer.close()

    def forget_in_child(self) -> None:
        """In a forked child: stop feeding this pipe and drop its fds without touching peers."""
        signal.set_wakeup_fd(-1)
        for sock in (self.reader, self.writer):
            sever(sock)


def sever(sock: socket.socket | None) -> None:
    """Close an inherited socket's fd in a child without shutting the connection down
    (``shutdown`` would end it for the parent too)."""
    if sock is None:
        return
    try:
        fd = sock.detach()
    except OSError:
        return
    if fd >= 0:
        import os

        try:
            os.close(fd)
        except OSError:
            pass
