"""The consumers of ``manage.py echomq_supervisor`` check Django's connections around each
job (echomq.contrib.django.middleware), as Django does around each request."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import echomq

pytest.importorskip("django")

from test_django_project import PROJECT, Project, _project  # noqa: E402


@pytest.fixture
def pg_project(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
               queue_name: str) -> Iterator[Project]:
    """The project on PostgreSQL with persistent connections (CONN_MAX_AGE None,
    CONN_HEALTH_CHECKS on), so a consumer keeps one connection from job to job."""
    for p in _project("postgresql", request, tmp_path, redis_url, queue_name):
        p.env["SHOP_PERSISTENT_CONNECTIONS"] = "1"
        yield p


def test_a_job_after_the_server_dropped_the_connection_succeeds(pg_project: Project,
                                                                redis_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "echomq_supervisor", "start", "--processes", "1",
         "--concurrency", "1"],
        cwd=PROJECT, env=pg_project.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    q = echomq.Queue(pg_project.queue, redis_url=redis_url)
    try:
        first = q.result(q.add("shop.tasks.backend_pid", {"args": [], "kwargs": {}}),
                         timeout=60)
        again = q.result(q.add("shop.tasks.backend_pid", {"args": [], "kwargs": {}}),
                         timeout=60)
        assert again == first  # one consumer, one connection kept across jobs
        engine = sa.create_engine(pg_project.database_url.replace("postgresql://",
                                                                  "postgresql+psycopg://"))
        try:
            with engine.connect() as conn:  # the server drops it between two jobs
                assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"),
                                    {"p": first}).scalar_one() is True
        finally:
            engine.dispose()
        after = q.result(q.add("shop.tasks.backend_pid", {"args": [], "kwargs": {}}),
                         timeout=60)
        assert after != first  # a new connection, and the job succeeded on it
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
