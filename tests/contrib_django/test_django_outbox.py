"""ADMIT "outbox" and the consumers' connection middleware of echomq.contrib.django, in the
test project (tests/contrib_django/project) on SQLite and PostgreSQL: manage.py as a
subprocess, and a real supervisor whose relay reads the project's database."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.relay import Relay

import echomq
from echomq import durable

pytest.importorskip("django")

from test_django_project import (  # noqa: E402
    PROJECT,
    Project,
    _project,
)


@pytest.fixture(params=["sqlite", "postgresql"])
def outbox_project(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
                   queue_name: str) -> Iterator[Project]:
    """The project with ADMIT "outbox", migrated (which creates the outbox table)."""
    for p in _project(request.param, request, tmp_path, redis_url, queue_name):
        p.env["SHOP_ADMIT"] = "outbox"
        yield p


def start_supervisor(project: Project, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "echomq_supervisor", "start", *args],
        cwd=PROJECT, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def engine_of(project: Project) -> sa.Engine:
    return sa.create_engine(project.database_url.replace("postgresql://",
                                                         "postgresql+psycopg://"))


def outbox_rows(project: Project) -> int:
    engine = engine_of(project)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM emq_outbox")).scalar_one())
    finally:
        engine.dispose()


def outbox_tokens(project: Project) -> dict[str, str]:
    """The project's outbox rows' tokens by job id (the project's process wrote them)."""
    engine = engine_of(project)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT job_id, spec FROM emq_outbox")).all()
    finally:
        engine.dispose()
    return {job_id: json.loads(spec)["t"] for job_id, spec in rows}


def admitted(project: Project, redis_url: str, job_ids: list[str]) -> dict[str, object]:
    """Relay the project's committed outbox rows; each job's result (PostgreSQL: a real
    supervisor, woken by NOTIFY, relays and runs them) or state (SQLite: the relay called
    here, on the project's database file, with no consumer writing beside it)."""
    q = echomq.Queue(project.queue, redis_url=redis_url)
    if project.database_url.startswith("sqlite"):
        engine = engine_of(project)
        try:
            Relay(project.queue, redis.Redis.from_url(redis_url), engine).run()
        finally:
            engine.dispose()
        return {jid: getattr(q.get(jid), "state", None) for jid in job_ids}
    proc = start_supervisor(project, "--processes", "1")
    try:
        # result() waits across the relay
        durable.note_outboxed(project.queue, outbox_tokens(project))
        return {jid: q.result(jid, timeout=60) for jid in job_ids}
    finally:
        stop(proc)


def expected(project: Project, result: object) -> object:
    return "waiting" if project.database_url.startswith("sqlite") else result


def test_committed_jobs_go_through_the_outbox_and_run(outbox_project: Project,
                                                      redis_url: str) -> None:
    placed = outbox_project.place("book")
    # written in the transaction itself: a row there before the commit, nothing in Valkey
    assert placed["outbox_rows"] == 2
    assert placed["exists_before_commit"] is False
    assert outbox_rows(outbox_project) == 2  # committed, waiting for the relay
    q = echomq.Queue(outbox_project.queue, redis_url=redis_url)
    assert q.get(str(placed["job"])) is None
    ids = [str(placed["job"]), str(placed["added"])]
    assert admitted(outbox_project, redis_url, ids) == dict.fromkeys(
        ids, expected(outbox_project, "shipped book"))
    assert outbox_rows(outbox_project) == 0  # deleted after the admit


def test_a_rolled_back_transaction_leaves_no_job(outbox_project: Project,
                                                 redis_url: str) -> None:
    placed = outbox_project.place("lamp", "--fail")
    assert placed["rolled_back"] is True and placed["outbox_rows"] == 2
    assert outbox_rows(outbox_project) == 0 and outbox_project.order_count() == 0
    # a job committed after the rolled-back ones: once it is through, the relay has been by
    later = outbox_project.place("pen")
    ids = [str(later["job"])]
    assert admitted(outbox_project, redis_url, ids) == dict.fromkeys(
        ids, expected(outbox_project, "shipped pen"))
    q = echomq.Queue(outbox_project.queue, redis_url=redis_url)
    assert q.get(str(placed["job"])) is None and q.get(str(placed["added"])) is None
    counts = q.counts()
    assert counts["completed"] + counts["waiting"] == 2  # "pen"'s two jobs, none of "lamp"


def test_a_view_that_raises_inside_atomic_admits_nothing(outbox_project: Project,
                                                         redis_url: str) -> None:
    script = """
import json
from django.test import Client
c = Client(raise_request_exception=False)
ok = c.get("/place/mug/")
bad = c.get("/place/vase/?fail=1")
print(json.dumps({"ok": ok.status_code, "job": ok.json()["job"], "bad": bad.status_code}))
"""
    done = outbox_project.manage("shell", "-c", script)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["ok"] == 200 and seen["bad"] == 500
    assert outbox_rows(outbox_project) == 1 and outbox_project.order_count() == 1
    assert admitted(outbox_project, redis_url, [seen["job"]]) == {
        seen["job"]: expected(outbox_project, "shipped mug")}
    q = echomq.Queue(outbox_project.queue, redis_url=redis_url)
    counts = q.counts()
    assert counts["completed"] + counts["waiting"] == 1
    assert outbox_rows(outbox_project) == 0


def test_the_migration_creates_the_floors_outbox_table(outbox_project: Project,
                                                      request: pytest.FixtureRequest,
                                                      tmp_path: Path) -> None:
    """manage.py migrate's table is the one ``echomq-supervisor migrate`` creates."""
    if outbox_project.database_url.startswith("sqlite"):
        reference = f"sqlite:///{tmp_path / 'floor.sqlite3'}"
    else:
        reference = request.getfixturevalue("throwaway_database")("reference")
    cli = Path(sys.executable).with_name("echomq-supervisor")
    done = subprocess.run([str(cli), "migrate", "--outbox-url", reference],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert shape(outbox_project.database_url) == shape(reference)
    # reversing the app's migration drops it
    outbox_project.manage("migrate", "echomq", "zero", "-v", "0")
    assert shape(outbox_project.database_url) is None
    # without the table an add in a transaction fails plainly, and nothing is written
    done = outbox_project.manage("place_order", "cup", check=False)
    assert done.returncode != 0 and "manage.py migrate echomq" in done.stderr
    assert outbox_project.order_count() == 0


def shape(url: str) -> dict[str, object] | None:
    """The outbox table as the database describes it (columns, key, indexes)."""
    engine = sa.create_engine(sa.make_url(url).set(
        drivername="postgresql+psycopg" if url.startswith("postgres") else "sqlite"))
    try:
        inspector = sa.inspect(engine)
        if not inspector.has_table("emq_outbox"):
            return None
        columns = [(c["name"], str(c["type"]), c["nullable"], c.get("default"),
                    c.get("autoincrement")) for c in inspector.get_columns("emq_outbox")]
        return {"columns": columns,
                "pk": inspector.get_pk_constraint("emq_outbox")["constrained_columns"],
                "indexes": sorted((i["name"], tuple(i["column_names"]), i["unique"])
                                  for i in inspector.get_indexes("emq_outbox"))}
    finally:
        engine.dispose()


def test_outside_a_transaction_the_outbox_mode_admits_at_once(outbox_project: Project) -> None:
    placed = outbox_project.place("pen", "--outside")
    assert placed["exists_before_commit"] is True
    assert outbox_rows(outbox_project) == 0
