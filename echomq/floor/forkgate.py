"""Keep ``os.fork()`` out of other threads' SQLite calls.

libsqlite3 guards its allocator and caches with process-wide mutexes. A fork
taken while another thread holds one (the supervisor's scheduler thread folding
into a SQLite floor, say) gives a child whose copy of that mutex stays locked
for ever: the child's first SQLite call of any kind (its own floor write, or a
handler's ``sqlite3``) hangs, and with it the job it holds. The gate counts the
threads inside a floor SQLite connection: every :class:`echomq.floor.Floor` call
from its start to its end (opening a connection and its connect-time pragmas,
statements, checkin, closing connections in ``dispose``), and any other checkout of
the engine's pool; a fork first stops new entries and waits for the others to leave,
so the child starts with every SQLite mutex free. The forking thread's own
connections do not make it wait; a thread that stays inside longer than
``WAIT_S`` is logged and the fork goes on. A forker that must not block (the
supervisor's loop) asks :meth:`ForkGate.try_pause` first and forks later when
a thread is inside.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("echomq.floor")
WAIT_S = 30.0


class ForkGate:
    """Counts threads inside SQLite; :meth:`before_fork` waits until none is."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._inside: dict[int, int] = {}  # thread ident -> open entries
        self._forking = False

    def enter(self) -> int:
        """Note that this thread is about to use SQLite (waits while a fork is under way);
        returns the token :meth:`leave` takes."""
        me = threading.get_ident()
        with self._cond:
            while self._forking and me not in self._inside:
                self._cond.wait()
            self._inside[me] = self._inside.get(me, 0) + 1
        return me

    def leave(self, token: int) -> None:
        """The thread that :meth:`enter` returned ``token`` to is done with SQLite."""
        with self._cond:
            left = self._inside.get(token, 0) - 1
            if left > 0:
                self._inside[token] = left
            else:
                self._inside.pop(token, None)
            self._cond.notify_all()

    def try_pause(self) -> bool:
        """Without waiting: stop new entries and return True when no other thread is inside
        SQLite (fork, then :meth:`resume`); False when one is (try again later)."""
        me = threading.get_ident()
        with self._cond:
            if self._inside.keys() - {me}:
                return False
            self._forking = True
            return True

    def resume(self) -> None:
        """Let threads enter SQLite again after the fork :meth:`try_pause` allowed."""
        self.after_fork_in_parent()

    @contextmanager
    def inside(self) -> Iterator[None]:
        """:meth:`enter` for the length of a ``with`` block, then :meth:`leave`."""
        token = self.enter()
        try:
            yield
        finally:
            self.leave(token)

    def before_fork(self) -> None:
        """Stop new entries and wait (up to WAIT_S) for other threads to leave SQLite."""
        me = threading.get_ident()
        with self._cond:
            self._forking = True
            if not self._cond.wait_for(lambda: not (self._inside.keys() - {me}), WAIT_S):
                log.warning("forking while another thread has been inside SQLite for %.0f s: "
                            "the child may hang at its first SQLite call", WAIT_S)

    def after_fork_in_parent(self) -> None:
        """Let threads enter SQLite again."""
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        """A fresh gate: the other threads did not come along."""
        self._reset()

    def watch(self, engine: Any) -> None:
        """Count every connection of a SQLite ``engine``: opening it, and each checkout
        until its checkin."""
        from sqlalchemy import event

        @event.listens_for(engine, "do_connect")
        def _open(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
            token = self.enter()
            try:
                return dialect.loaded_dbapi.connect(*cargs, **cparams)
            finally:
                self.leave(token)

        @event.listens_for(engine, "checkout")
        def _checkout(_dbapi: Any, record: Any, _proxy: Any) -> None:
            record.info["fork_gate"] = self.enter()

        @event.listens_for(engine, "checkin")
        def _checkin(_dbapi: Any, record: Any) -> None:
            token = record.info.pop("fork_gate", None)
            if token is not None:
                self.leave(token)


GATE = ForkGate()
os.register_at_fork(before=GATE.before_fork, after_in_parent=GATE.after_fork_in_parent,
                    after_in_child=GATE.after_fork_in_child)
