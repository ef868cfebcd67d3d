"""No fork while another thread is inside a SQLite floor connection: the child would inherit
libsqlite3's mutexes locked and hang at its first SQLite call."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import event

from echomq.floor import Floor
from echomq.floor.engine import make_engine


def _fork_child_that_uses_sqlite(path: Path, forked: threading.Event, codes: list[int]) -> None:
    pid = os.fork()
    if pid == 0:  # the child: SQLite must work at once
        try:
            sqlite3.connect(str(path)).execute("SELECT 1").fetchall()
            os._exit(0)
        finally:
            os._exit(1)
    forked.set()
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


def test_a_fork_waits_until_other_threads_leave_sqlite(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'floor.db'}")
    inside, release = threading.Event(), threading.Event()

    def floor_work() -> None:  # as the scheduler thread folding into the floor
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            inside.set()
            release.wait(30)

    worker = threading.Thread(target=floor_work)
    worker.start()
    assert inside.wait(10)
    forked, codes = threading.Event(), []
    forker = threading.Thread(target=_fork_child_that_uses_sqlite,
                              args=(tmp_path / "child.db", forked, codes))
    forker.start()
    # the fork is held while the other thread is inside SQLite (a broken gate forks at once)
    assert not forked.wait(1.0)
    release.set()
    assert forked.wait(30), "the fork never went on after the thread left SQLite"
    forker.join(30)
    worker.join(30)
    assert codes == [0]
    # and a thread may use the floor again once the fork is done
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT 2").scalar() == 2
    engine.dispose()


def test_the_forking_threads_own_connection_does_not_hold_its_fork(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'floor.db'}")
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    engine.dispose()


def _held_fork_while(tmp_path: Path, floor_call: Callable[[], object], hold: threading.Event,
                     release: threading.Event) -> None:
    """Run ``floor_call`` on a thread until it reaches ``hold`` (a hook inside its SQLite
    work), fork meanwhile: the fork must wait until the thread is let go."""
    worker = threading.Thread(target=floor_call)
    worker.start()
    assert hold.wait(10)
    forked, codes = threading.Event(), []
    forker = threading.Thread(target=_fork_child_that_uses_sqlite,
                              args=(tmp_path / "child.db", forked, codes))
    forker.start()
    try:
        assert not forked.wait(1.0), "forked while another thread was inside SQLite"
    finally:
        release.set()
        assert forked.wait(30), "the fork never went on after the thread left SQLite"
        forker.join(30)
        worker.join(30)
    assert codes == [0]


def _blocking_hook(hold: threading.Event, release: threading.Event) -> Callable[..., None]:
    def hook(*_args: object) -> None:
        if not hold.is_set():
            hold.set()
            release.wait(30)
    return hook


def test_a_fork_waits_for_a_thread_setting_up_a_new_floor_connection(tmp_path: Path) -> None:
    # the engine's connect listeners (busy_timeout, WAL, the dialect's first queries) run
    # after the driver's connect returned and before the checkout: SQLite work all the same
    floor = Floor.from_url(f"sqlite:///{tmp_path / 'floor.db'}")
    floor.upgrade()
    floor.dispose()  # the next call opens a new connection
    hold, release = threading.Event(), threading.Event()
    event.listen(floor._engine, "connect", _blocking_hook(hold, release))
    _held_fork_while(tmp_path, lambda: floor.count("q"), hold, release)
    assert floor.count("q") == 0
    floor.dispose()


def test_a_fork_waits_for_a_thread_closing_the_floors_connections(tmp_path: Path) -> None:
    floor = Floor.from_url(f"sqlite:///{tmp_path / 'floor.db'}")
    floor.upgrade()  # leaves a pooled connection for dispose() to close
    hold, release = threading.Event(), threading.Event()
    event.listen(floor._engine, "close", _blocking_hook(hold, release))
    _held_fork_while(tmp_path, floor.dispose, hold, release)
    assert floor.count("q") == 0
    floor.dispose()
