"""A hook that may hold a producer's admit back until later.

A framework integration installs one: ``echomq.contrib.django`` runs the admits of jobs
added inside a database transaction when it commits, and none when it rolls back. The
job's id is known before anything is sent, so ``add`` returns it either way.

An integration may also install an outboxer: it writes plain jobs (no ``after``, no
``expires``) into the transactional outbox on the framework's own connection, inside
its transaction (``ADMIT: "outbox"`` of ``echomq.contrib.django``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# given the admit to run, returns True when it took it (to run later), False to run it now
Deferrer = Callable[[Callable[[], None]], bool]

# read by Queue.add before it builds the callback (no cost when none is installed)
deferrer: Deferrer | None = None


# given the queue's name and validated jobs (echomq.admit.Spec), returns True when it
# wrote them into the outbox (through echomq.outbox.write_cursor, which notes their rows'
# tokens for result()), False to admit them as usual
Outboxer = Callable[[str, Sequence[Any]], bool]
outboxer: Outboxer | None = None


def set_outboxer(new: Outboxer | None) -> Outboxer | None:
    """Install ``new`` for this process (None: none); returns the one it replaces."""
    global outboxer
    previous: Outboxer | None = outboxer
    outboxer = new
    return previous


def outboxed(queue: str, specs: Sequence[Any]) -> bool:
    """True when the installed outboxer wrote these jobs into the outbox."""
    return outboxer is not None and outboxer(queue, specs)


def set_deferrer(new: Deferrer | None) -> Deferrer | None:
    """Install ``new`` for this process (None: every admit runs at once); returns the
    one it replaces."""
    global deferrer
    previous: Deferrer | None = deferrer
    deferrer = new
    return previous


def deferred(admit: Callable[[], None]) -> bool:
    """True when the installed deferrer took ``admit`` to run later."""
    return deferrer is not None and deferrer(admit)
