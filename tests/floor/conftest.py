"""Floor fixtures: every test runs on a SQLite file and on a fresh PostgreSQL database.

PostgreSQL comes from ECHOMQ_TEST_PG_URL (default: the local ``test`` database,
used only to CREATE/DROP a throwaway ``echomq_test_<hex>`` database per test).
When it is unreachable the PostgreSQL cases fail under CI (env var CI set) and
skip elsewhere.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from echomq.floor import Floor

PG_ADMIN_URL = os.environ.get(
    "ECHOMQ_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[sa.Engine]:
    """An AUTOCOMMIT engine on the admin database, or fail/skip if unreachable."""
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
def pg_url(pg_admin: sa.Engine) -> Iterator[str]:
    """A URL to a brand-new, empty PostgreSQL database, dropped after the test."""
    name = f"echomq_test_{uuid.uuid4().hex[:16]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = pg_admin.url.set(database=name)
    yield url.render_as_string(hide_password=False)
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def floor_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty floor database URL for the current backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'floor.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def empty_floor(floor_url: str) -> Iterator[Floor]:
    """A Floor on a database no migration has touched."""
    floor = Floor.from_url(floor_url)
    yield floor
    floor.dispose()


@pytest.fixture
def floor(empty_floor: Floor) -> Floor:
    """A Floor migrated to head."""
    empty_floor.upgrade()
    return empty_floor


@pytest.fixture
def pg_floor(pg_url: str) -> Iterator[Floor]:
    """A migrated Floor on PostgreSQL only, for PostgreSQL-specific behaviour."""
    floor = Floor.from_url(pg_url)
    floor.upgrade()
    yield floor
    floor.dispose()
