"""Floor fixtures: every test runs on a SQLite file and on a fresh PostgreSQL database.

PostgreSQL comes from ECHOMQ_TEST_PG_URL (default: the local ``test`` database,
used only to CREATE/DROP a throwaway ``echomq_test_<hex>`` database per test).
When it is unreachable the PostgreSQL cases fail under CI (env var CI set) and
skip elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from echomq.supervisor.drills.localredis import LocalRedis

from echomq.floor import Floor


@pytest.fixture
def pg_url(throwaway_database: Callable[[str], str]) -> str:
    """A URL to a brand-new, empty PostgreSQL database, dropped after the test."""
    return throwaway_database("echomq_test")


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


@pytest.fixture
def server(private_redis: LocalRedis) -> LocalRedis:
    """A Valkey of the test's own, free to restart empty (tests/conftest.py's private_redis)."""
    return private_redis
