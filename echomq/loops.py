"""The event loop a consumer runs async handlers and concurrent round trips on.

``ECHOMQ_EVENT_LOOP`` chooses it: ``auto`` (the default) takes uvloop when it is installed
(``pip install 'echomq[uvloop]'``) and asyncio's own loop otherwise, ``asyncio`` always
takes asyncio's, ``uvloop`` requires uvloop. uvloop runs callbacks with less overhead, so a
busy concurrent consumer's timers fire later by less (every job's ``await`` waits on them).
Loops are made per process, after a fork.
"""

from __future__ import annotations

import asyncio
import os

from echomq.errors import ConfigError

LOOP_ENV = "ECHOMQ_EVENT_LOOP"
KINDS = ("auto", "asyncio", "uvloop")


def loop_kind() -> str:
    """``asyncio`` or ``uvloop``: what :func:`new_event_loop` makes here."""
    wanted = os.environ.get(LOOP_ENV, "").strip().lower() or "auto"
    if wanted not in KINDS:
        raise ConfigError(f"{LOOP_ENV} must be one of {', '.join(KINDS)}, got {wanted!r}")
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if wanted == "uvloop":
            raise ConfigError(f"{LOOP_ENV}=uvloop but uvloop is not installed "
                              "(pip install 'echomq[uvloop]')") from None
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind :func:`loop_kind` names."""
    if loop_kind() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()
