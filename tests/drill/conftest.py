"""Drill fixtures: a throwaway PostgreSQL database per test (fail, not skip, under CI)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from echomq.supervisor.drills.localredis import server_binary


@pytest.fixture(autouse=True)
def _needs_a_server_binary() -> None:
    """The drills kill, stop and restart their own redis-server; a container will not do."""
    if server_binary() is None:
        reason = "the drills need a redis-server/valkey-server binary on PATH"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def pg_floor_url(throwaway_database: Callable[[str], str]) -> str:
    """A fresh ``echomq_drill_<hex>`` database, dropped after the test."""
    return throwaway_database("echomq_drill")
