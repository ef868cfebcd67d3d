"""Every floor call is bounded: a held lock, a slow statement or a silent server makes
the call fail with FloorError within its timeout instead of waiting forever."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from echomq.errors import FloorError
from echomq.floor import Floor, FloorRow
from echomq.floor.schema import jobs

ROW = [FloorRow(job_id="j1", due_ms=1, fields={"state": "scheduled"})]


def _settings(floor: Floor, *names: str) -> list[str]:
    with floor._engine.connect() as conn:
        return [conn.exec_driver_sql(f"SHOW {name}").scalar_one() for name in names]


def test_postgres_sessions_carry_statement_lock_and_tcp_bounds(pg_url: str) -> None:
    floor = Floor.from_url(pg_url, statement_timeout_ms=4000, lock_timeout_ms=1500,
                           tcp_user_timeout_ms=7000)
    try:
        assert _settings(floor, "statement_timeout", "lock_timeout") == ["4s", "1500ms"]
        with floor._engine.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert params["tcp_user_timeout"] == "7000"
        assert params["keepalives"] == "1" and params["keepalives_count"] == "3"
    finally:
        floor.dispose()


def test_bounds_in_the_url_win(pg_url: str) -> None:
    url = pg_url + "?options=-c%20statement_timeout%3D1234&tcp_user_timeout=2500"
    floor = Floor.from_url(url)
    try:
        assert _settings(floor, "statement_timeout", "lock_timeout") == ["1234ms", "0"]
        with floor._engine.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert params["tcp_user_timeout"] == "2500"
    finally:
        floor.dispose()


def test_a_held_table_lock_fails_the_write_after_the_lock_timeout(
        pg_floor: Floor, pg_url: str) -> None:
    holder = sa.create_engine(pg_url)
    bounded = Floor.from_url(pg_url, lock_timeout_ms=300)
    try:
        with holder.connect() as conn, conn.begin():
            conn.exec_driver_sql(f"LOCK TABLE {jobs.name} IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(FloorError, match="lock timeout"):
                bounded.upsert("q", ROW, None)
            # generous: the bound is 300 ms; "forever" is what this rules out
            assert time.monotonic() - started < 20
        bounded.upsert("q", ROW, None)  # the lock gone, the same write goes through
        assert bounded.count("q") == 1
    finally:
        bounded.dispose()
        holder.dispose()


def test_a_slow_statement_is_cancelled_by_the_statement_timeout(pg_url: str) -> None:
    floor = Floor.from_url(pg_url, statement_timeout_ms=200)
    try:
        with pytest.raises(sa.exc.OperationalError, match="statement timeout"), \
                floor._engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_sleep(30)")
    finally:
        floor.dispose()


def test_sqlite_writer_waits_out_its_busy_timeout_then_fails(tmp_path: Path) -> None:
    path = tmp_path / "floor.db"
    floor = Floor.from_url(f"sqlite:///{path}", busy_timeout_ms=200)
    floor.upgrade()
    lock = sqlite3.connect(path, timeout=1)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        with pytest.raises(FloorError):
            floor.upsert("q", ROW, None)
    finally:
        lock.rollback()
        lock.close()
    floor.upsert("q", ROW, None)
    assert floor.count("q") == 1
    floor.dispose()
