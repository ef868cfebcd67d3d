"""A middleware whose first build, in the first consumer to make it, never returns: a
consumer stuck before READY (as on a lock a parent thread held at the fork). The file
ECHOMQ_TEST_BOOT_MARK names says which process was first; later builds return at once."""

from __future__ import annotations

import os
import threading

import echomq


class StuckOnce(echomq.Middleware):
    def __init__(self) -> None:
        try:
            fd = os.open(os.environ["ECHOMQ_TEST_BOOT_MARK"],
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        threading.Event().wait()  # stuck for good: only a signal ends this process
