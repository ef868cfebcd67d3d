"""Drill fixtures: a throwaway PostgreSQL database per test (fail, not skip, under CI)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from supervisor.localredis import server_binary

PG_ADMIN_URL = os.environ.get(
    "ECHOMQ_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(autouse=True)
def _needs_a_server_binary() -> None:
    """The drills kill, stop and restart their own redis-server; a container will not do."""
    if server_binary() is None:
        reason = "the drills need a redis-server/valkey-server binary on PATH"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[sa.Engine]:
    engine = sa.create_engine(
        PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
    )
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        engine.dispose()
        reason = f"PostgreSQL unreachable at {sa.make_url(PG_ADMIN_URL)!r}: {exc.orig}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason + " (set CI to make this a failure)")
    yield engine
    engine.dispose()


@pytest.fixture
def pg_floor_url(pg_admin: sa.Engine) -> Iterator[str]:
    """A fresh ``echomq_drill_<hex>`` database, dropped after the test."""
    name = f"echomq_drill_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield pg_admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with pg_admin.connect() as conn:
            # a failed floor-outage drill must not leave the database locked out
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
