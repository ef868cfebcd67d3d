"""echomq.contrib.django in a real Django project (tests/contrib_django/project), on SQLite and
PostgreSQL, with manage.py run as a subprocess and a real supervisor running the jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import echomq

pytest.importorskip("django")

PROJECT = Path(__file__).parent / "project"


class Project:
    """The test project on one database and one queue."""

    def __init__(self, database_url: str, redis_url: str, queue: str) -> None:
        self.database_url = database_url
        self.queue = queue
        self.env = {**os.environ, "SHOP_DATABASE_URL": database_url,
                    "ECHOMQ_REDIS_URL": redis_url, "SHOP_QUEUE": queue,
                    "PYTHONPATH": str(PROJECT)}

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=self.env,
                              capture_output=True, text=True, timeout=120)
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def place(self, *args: str) -> dict[str, object]:
        return json.loads(self.manage("place_order", *args).stdout.strip().splitlines()[-1])

    def shipped_by(self, order_id: int) -> int | None:
        engine = sa.create_engine(self.database_url.replace("postgresql://",
                                                            "postgresql+psycopg://"))
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT shipped_by FROM shop_order WHERE id = :i"),
                                    {"i": order_id}).scalar_one()
        finally:
            engine.dispose()

    def order_count(self) -> int:
        engine = sa.create_engine(self.database_url.replace("postgresql://",
                                                            "postgresql+psycopg://"))
        try:
            with engine.connect() as conn:
                return int(conn.execute(sa.text("SELECT count(*) FROM shop_order")).scalar_one())
        finally:
            engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def project(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
            queue_name: str) -> Iterator[Project]:
    """The project on each database in turn, migrated."""
    yield from _project(request.param, request, tmp_path, redis_url, queue_name)


@pytest.fixture
def sqlite_project(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
                   queue_name: str) -> Iterator[Project]:
    """The project on SQLite alone, for what does not depend on the database."""
    yield from _project("sqlite", request, tmp_path, redis_url, queue_name)


def _project(db: str, request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
             queue_name: str) -> Iterator[Project]:
    if db == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    else:
        make: Callable[[str], str] = request.getfixturevalue("throwaway_database")
        url = sa.make_url(make("django")).set(drivername="postgresql").render_as_string(
            hide_password=False)
    p = Project(url, redis_url, queue_name)
    p.manage("migrate", "-v", "0")
    yield p


@pytest.fixture
def supervisor(project: Project) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "echomq_supervisor", "start", "--processes", "2"],
        cwd=PROJECT, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_jobs_sent_in_a_transaction_are_admitted_at_commit_and_run_by_the_supervisor(
        project: Project, supervisor: subprocess.Popen[str], redis_url: str) -> None:
    placed = project.place("book")
    assert placed["exists_before_commit"] is False  # held until the commit
    assert placed["exists_after"] is True
    q = echomq.Queue(project.queue, redis_url=redis_url)
    assert q.result(str(placed["job"]), timeout=60) == "shipped book"
    assert q.result(str(placed["added"]), timeout=60) == "shipped book"  # Queue.add too
    pid = project.shipped_by(1)
    # run by a forked consumer, on a connection of its own
    assert pid is not None and pid != supervisor.pid


def test_a_rollback_admits_nothing(project: Project, redis_url: str) -> None:
    placed = project.place("lamp", "--fail")
    assert placed["rolled_back"] is True
    assert placed["exists_before_commit"] is False and placed["exists_after"] is False
    q = echomq.Queue(project.queue, redis_url=redis_url)
    assert q.get(str(placed["job"])) is None and q.get(str(placed["added"])) is None
    assert q.counts()["waiting"] == 0 and q.counts()["scheduled"] == 0
    assert project.order_count() == 0


def test_outside_a_transaction_the_add_is_immediate(sqlite_project: Project,
                                                    redis_url: str) -> None:
    placed = sqlite_project.place("pen", "--outside")
    assert placed["exists_before_commit"] is True
    # settings.ECHOMQ["DEFAULTS"] made the task's queue: its max_attempts, not the 3 built in
    job = echomq.Queue(sqlite_project.queue, redis_url=redis_url).get(
        str(placed["job"]))
    assert job is not None and job.max_attempts == 5


def test_manage_py_echomq_is_the_cli_on_the_projects_server(sqlite_project: Project,
                                                            redis_url: str) -> None:
    sqlite_project.place("cup")
    done = sqlite_project.manage("echomq", "queues", "--json")
    queues = {row["queue"]: row for row in json.loads(done.stdout)}
    assert queues[sqlite_project.queue]["waiting"] == 2
    bad = sqlite_project.manage("echomq", "no-such-command", check=False)
    assert bad.returncode == 2


def test_the_dashboard_view_asks_for_a_staff_user(sqlite_project: Project) -> None:
    sqlite_project.place("hat")
    script = """
from django.contrib.auth.models import User
from django.test import Client
c = Client()
print("anonymous", c.get("/ops/echomq/").status_code)
User.objects.create_user("ann", password="pw")
c.login(username="ann", password="pw")
print("user", c.get("/ops/echomq/").status_code)
User.objects.create_user("sam", password="pw", is_staff=True)
c.login(username="sam", password="pw")
page = c.get("/ops/echomq/?queue=%s" % QUEUE)
print("staff", page.status_code)
body = page.content.decode()
print("names_queue", QUEUE in body)
print("links_mounted", 'href="/ops/echomq/?' in body and 'href="/?' not in body)
print("post", c.post("/ops/echomq/").status_code)
""".replace("QUEUE", repr(sqlite_project.queue))
    done = sqlite_project.manage("shell", "-c", script)
    out = done.stdout.split("\n", 1)[1].split() if "automatically" in done.stdout \
        else done.stdout.split()
    assert len(out) == 12, done.stdout + done.stderr
    seen = dict(zip(out[::2], out[1::2], strict=True))
    assert seen == {"anonymous": "302", "user": "302", "staff": "200", "names_queue": "True",
                    "links_mounted": "True", "post": "405"}


def test_a_new_project_s_settings_are_checked(tmp_path: Path) -> None:
    from echomq.contrib.django import conf

    assert conf.parse(None).admit == "on_commit"
    assert conf.parse({"ADMIT": "outbox"}).admit == "outbox"
    with pytest.raises(echomq.ConfigError, match="unknown key"):
        conf.parse({"REDIS": "x"})
    assert conf.parse({"DEFAULTS": {"max_attempts": 5}}).defaults == {"max_attempts": 5}
    with pytest.raises(echomq.ConfigError, match="DEFAULTS.*unknown queue setting"):
        conf.parse({"DEFAULTS": {"max_attempt": 5}})
    with pytest.raises(echomq.ConfigError, match="DEFAULTS"):
        conf.parse({"DEFAULTS": ["max_attempts"]})
    with pytest.raises(echomq.ConfigError, match="ADMIT"):
        conf.parse({"ADMIT": "later"})
    with pytest.raises(echomq.ConfigError, match="QUEUES"):
        conf.parse({"QUEUES": "emails"})


def test_supervisor_arguments_fill_in_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from echomq.contrib.django.conf import EchoSettings
    from echomq.contrib.django.supervise import supervisor_argv

    echo = EchoSettings(redis_url="redis://h/0", floor="sqlite:///f", tasks=("a.tasks",),
                        queues=("q1", "q2"), supervisor=("--processes", "3"))
    assert supervisor_argv([], echo, []) == [
        "start", "--redis-url", "redis://h/0", "--floor-url", "sqlite:///f",
        "--tasks", "a.tasks", "--queue", "q1,q2",
        "--middleware", "echomq.contrib.django.middleware:CloseOldConnections",
        "--processes", "3"]
    assert supervisor_argv(["--redis-url=redis://other/0", "--queue", "x"], echo, [])[:3] == [
        "start", "--floor-url", "sqlite:///f"]
    assert supervisor_argv(["migrate"], echo, []) == ["migrate", "--floor-url", "sqlite:///f"]
    # the project's own middleware runs too, from the command line or the environment
    argv = supervisor_argv(["--middleware", "shop.mw:Audit"], echo, [])
    assert argv.count("--middleware") == 2 and argv[-1] == "shop.mw:Audit"
    monkeypatch.setenv("ECHOMQ_MIDDLEWARE", "shop.mw:Env")
    assert supervisor_argv([], echo, [])[-5:-2] == [
        "echomq.contrib.django.middleware:CloseOldConnections", "--middleware", "shop.mw:Env"]
