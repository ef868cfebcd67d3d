"""URL handling, redaction, unreachable databases and SQLite under concurrent writers."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from echomq.errors import FloorError
from echomq.floor import Floor, FloorRow, make_engine, redact_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgres://u:s%40cr:et@h/db", "postgres://u:***@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql://h/db?user=u&password=secret", "postgresql://h/db?user=u&password=***"),
        ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
        ("not a url :secret@", "not a url :***@"),  # parsed from the right, even so
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_url_with_at_in_password() -> None:
    assert "p@ss" not in redact_url("postgresql://u:p@ss@h/db")


@pytest.mark.parametrize(
    "url", ["postgres://u:pw@h/db", "postgresql://u:pw@h/db", "postgresql+psycopg://u:pw@h/db"]
)
def test_postgres_urls_use_psycopg(url: str) -> None:
    engine = make_engine(url)
    assert engine.url.drivername == "postgresql+psycopg"
    engine.dispose()


def test_sqlite_engine_is_wal(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'f.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    engine.dispose()


@pytest.mark.parametrize("url", ["mysql://u:secret@h/db", "redis://:secret@h:6379/0", "::::"])
def test_unsupported_urls(url: str) -> None:
    with pytest.raises(FloorError) as info:
        make_engine(url)
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:secret@127.0.0.1:1/x", "postgres://u:secret@127.0.0.1:1/x?connect_timeout=2"],
)
def test_unreachable_postgres_raises_floor_error_without_password(url: str) -> None:
    floor = Floor.from_url(url)
    for call in (floor.ping, floor.check_at_head, lambda: floor.count("q")):
        with pytest.raises(FloorError) as info:
            call()
        assert "secret" not in str(info.value)
        assert "127.0.0.1:1" in str(info.value)
        assert info.value.__cause__ is not None
    with pytest.raises(FloorError) as info:
        floor.upsert("q", [FloorRow("a", 1, {})], fence=1)
    assert "secret" not in str(info.value)
    floor.dispose()


def test_unreachable_sqlite_raises_floor_error(tmp_path: Path) -> None:
    floor = Floor.from_url(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'f.db'}")
    with pytest.raises(FloorError, match="ping failed"):
        floor.ping()
    floor.dispose()


def _writer(url: str, worker: int, batches: int) -> None:
    floor = Floor.from_url(url)
    for batch in range(batches):
        rows = [FloorRow(f"w{worker}-{batch}-{i}", batch, {"i": str(i)}) for i in range(20)]
        floor.upsert("q", rows, fence=1)
        floor.mark_spilled("q", [r.job_id for r in rows[:5]], fence=1)
        floor.close_jobs("q", [r.job_id for r in rows[15:]], fence=1)
        floor.count("q")
    floor.dispose()


def test_sqlite_two_processes_write_concurrently(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'floor.db'}"
    with Floor.from_url(url) as floor:
        floor.upgrade()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(url, w, 60)) for w in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    with Floor.from_url(url) as floor:
        assert floor.count("q") == 3 * 60 * 15
        assert floor.count("q", spilled=True) == 3 * 60 * 5


def _write_in_child(url: str) -> int:
    """In a forked child: a floor of its own writes a row; the exit code says how it went."""
    floor = Floor.from_url(url, busy_timeout_ms=1000)
    try:
        floor.write_through("q", [FloorRow("child", 1, {"state": "scheduled"})])
    except FloorError:
        return 1
    finally:
        floor.dispose()
    return 0


def test_a_process_forked_while_a_floor_transaction_runs_can_write_the_floor(
        tmp_path: Path) -> None:
    import os
    import threading

    url = f"sqlite:///{tmp_path / 'floor.db'}"
    floor = Floor.from_url(url)
    floor.upgrade()
    floor.upsert("q", [FloorRow("due", 1, {"state": "scheduled"}, spilled=True)], 1)
    inside, leave = threading.Event(), threading.Event()

    def apply(rows: list[FloorRow]) -> None:  # holds restore_due's write transaction open
        inside.set()
        leave.wait(10)

    holder = threading.Thread(target=floor.restore_due, args=("q", 10, 10, 1, apply))
    holder.start()
    assert inside.wait(10)
    assert not floor.pause_for_fork()  # a transaction is open: no fork now
    leave.set()
    holder.join(10)
    assert floor.pause_for_fork()
    try:
        pid = os.fork()
        if pid == 0:
            floor.forget_after_fork()
            os._exit(_write_in_child(url))
    finally:
        floor.resume_after_fork()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert floor.count("q") == 2
    floor.dispose()
