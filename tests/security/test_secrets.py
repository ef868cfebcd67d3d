"""A known secret string, given as the Valkey and floor passwords through flags and
environment variables, never reaches an output surface: log lines (plain and JSON),
exceptions with their whole chained traceback, /readyz, /metrics, drill reports.

Both forms of a Redis URL's credentials are swept: ``user:password@`` and the query's
``?username=&password=`` (redis-py honours both), given by flag or environment; and the
``echomq`` CLI's output and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import LocalRedis, free_port

import echomq
from echomq.errors import EchoMQError
from echomq.floor import Floor

from .conftest import ROOT, Proc, wait_until

SECRET = "s3cret-Sentinel-Value-91"
FLOOR_SECRET = "fl00r-Sentinel-Value-27"


def _body(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()
    except urllib.error.URLError:
        return ""  # not listening yet


FORMS = ["userinfo", "query"]


def _redis_url(port: int, password: str, form: str) -> str:
    """The user "worker" with ``password``, in the URL's userinfo or in its query."""
    if form == "userinfo":
        return f"redis://worker:{password}@127.0.0.1:{port}/0"
    return f"redis://127.0.0.1:{port}/0?username=worker&password={password}"


def _clean(text: str, where: str) -> None:
    for secret in (SECRET, FLOOR_SECRET):
        assert secret not in text, f"a password reached {where}:\n{text}"


@pytest.fixture
def protected() -> Iterator[LocalRedis]:
    """A server whose user "worker" has the password SECRET."""
    server = LocalRedis().start()
    redis.Redis(port=server.port).execute_command(
        "ACL", "SETUSER", "worker", "on", f">{SECRET}", "~*", "&*", "+@all")
    yield server
    server.stop()


def _pg_url(throwaway_database: Callable[[str], str]) -> str:
    """A real floor whose URL carries FLOOR_SECRET (the test server trusts local users, so
    the password is carried everywhere but checked nowhere)."""
    url = sa.make_url(throwaway_database("emq_secret"))
    return url.set(password=FLOOR_SECRET).render_as_string(hide_password=False)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("log_json", ["false", "true"])
def test_supervisor_logs_and_health_pages_hold_no_password(
        protected: LocalRedis, queue_name: str, run_supervisor: Callable[..., Proc],
        throwaway_database: Callable[[str], str], log_json: str, form: str) -> None:
    redis_url = _redis_url(protected.port, SECRET, form)
    floor_url = _pg_url(throwaway_database)
    env = {"ECHOMQ_REDIS_URL": redis_url, "ECHOMQ_FLOOR_URL": floor_url,
           "ECHOMQ_TEST_LEDGER_URL": redis_url}
    migrate = subprocess.run([sys.executable, "-m", "echomq.supervisor.cli", "migrate"],
                             env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=60)
    assert migrate.returncode == 0, migrate.stderr
    _clean(migrate.stdout + migrate.stderr, "migrate's output")
    port = free_port()
    sup = run_supervisor("start", "--queue", queue_name, "--handler", "sup_jobs:record",
                         "--health-port", str(port), "--beat-ms", "100",
                         env={**env, "ECHOMQ_LOG_JSON": log_json})
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = [q.add("x", {}), q.add("x", {"fail_first": True}, backoff=0.1),
           q.add("x", {}, delay=3600)]
    wait_until(lambda: q.get(ids[1]).state == "completed", 20, "jobs")  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: '"floor": "ok"' in _body(base + "/readyz"), 20, "the floor in readyz")
    for page in ("/livez", "/readyz", "/metrics"):
        _clean(_body(base + page), page)
    protected.pause()  # Valkey unreachable: the outage is logged with its URL
    sup.wait_for("unreachable", 30)
    protected.resume()
    sup.wait_for("available again", 30)
    assert sup.stop() == 0
    _clean(sup.output, f"the supervisor's log (ECHOMQ_LOG_JSON={log_json})")
    shown = "worker:***@" if form == "userinfo" else "password=***"
    assert shown in sup.output  # the URL is shown, redacted
    if log_json == "true":
        for line in sup.lines:
            json.loads(line)


@pytest.mark.parametrize("form", FORMS)
def test_failures_at_start_name_the_url_without_its_password(
        protected: LocalRedis, queue_name: str, run_supervisor: Callable[..., Proc],
        form: str) -> None:
    wrong = _redis_url(protected.port, f"wrong-{SECRET}", form)
    unreachable_floor = f"postgresql://echomq:{FLOOR_SECRET}@127.0.0.1:{free_port()}/echomq"
    sup = run_supervisor("start", "--queue", queue_name, "--handler", "sup_jobs:record",
                         "--beat-ms", "100",
                         env={"ECHOMQ_REDIS_URL": wrong, "ECHOMQ_FLOOR_URL": unreachable_floor,
                              "ECHOMQ_TEST_LEDGER_URL": "redis://unused"})
    sup.wait_for("unreachable", 30)
    sup.stop()
    _clean(sup.output, "the supervisor's log")
    done = subprocess.run([sys.executable, "-m", "echomq.supervisor.cli", "migrate"],
                          env={**os.environ, "ECHOMQ_FLOOR_URL": unreachable_floor},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    _clean(done.stdout + done.stderr, "migrate's error")


def _formatted(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.mark.parametrize("form", FORMS)
def test_exceptions_and_their_causes_hold_no_password(protected: LocalRedis, form: str) -> None:
    wrong = _redis_url(protected.port, f"{SECRET}-no", form)
    q = echomq.Queue("q", redis_url=wrong)
    _clean(repr(q), "repr(Queue)")
    with pytest.raises(EchoMQError) as caught:
        q.add("x", {})
    _clean(_formatted(caught.value), "the exception")
    down = echomq.Queue("q", redis_url=_redis_url(free_port(), SECRET, form))
    with pytest.raises(echomq.ConnectionFailed) as caught:
        down.ping()
    _clean(_formatted(caught.value), "the exception")
    with pytest.raises(echomq.ConnectionFailed) as caught:
        echomq.Queue("q", redis_url=f"redis://worker:{SECRET}@[bad/0")
    _clean(_formatted(caught.value), "the exception")
    floor = Floor.from_url(f"postgresql://echomq:{FLOOR_SECRET}@127.0.0.1:{free_port()}/x",
                           connect_timeout_s=2)
    _clean(repr(floor), "repr(Floor)")
    with pytest.raises(EchoMQError) as floor_error:
        floor.check_at_head()
    _clean(_formatted(floor_error.value), "the floor's exception")


@pytest.mark.parametrize("form", FORMS)
def test_cli_output_and_errors_hold_no_password(protected: LocalRedis, queue_name: str,
                                                form: str) -> None:
    good = _redis_url(protected.port, SECRET, form)
    echomq.Queue(queue_name, redis_url=good).add("x", {"n": 1})
    runs = [
        (good, ["queues"]), (good, ["--json", "queues"]), (good, ["stats", queue_name]),
        (good, ["stats", "no-such-queue"]),  # refused: names the queue and the server
        (_redis_url(protected.port, f"wrong-{SECRET}", form), ["stats", queue_name]),
        (_redis_url(free_port(), SECRET, form), ["--json", "queues"]),  # unreachable
    ]
    codes = []
    for url, argv in runs:
        done = subprocess.run([sys.executable, "-m", "echomq.ops.cli", "--redis-url", url,
                               *argv], capture_output=True, text=True, timeout=60)
        codes.append(done.returncode)
        _clean(done.stdout + done.stderr, f"echomq {' '.join(argv)}")
    assert codes == [0, 0, 0, 1, 1, 1]


def test_drill_report_holds_no_password(throwaway_database: Callable[[str], str],
                                        tmp_path: Path) -> None:
    floor_url = _pg_url(throwaway_database)
    done = subprocess.run(
        [sys.executable, "-m", "echomq.supervisor.cli", "drill", "kill-consumer", "--jobs", "60",
         "--processes", "1", "--report", "json"],
        env={**os.environ, "ECHOMQ_FLOOR_URL": floor_url}, cwd=ROOT, capture_output=True,
        text=True, timeout=240)
    _clean(done.stdout + done.stderr, "the drill report")
    report = json.loads(done.stdout)
    assert report["ok"], report


DASHBOARD_TOKEN = "dashTok-Sentinel-Value-5533-xyz"


def _request(url: str, data: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """One request, redirects not followed: (status, body, headers)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(req, timeout=10) as resp:
            return int(resp.status), resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(), dict(exc.headers)


def test_dashboard_actions_without_a_token_stop_the_supervisor_at_start(
        redis_url: str, queue_name: str, run_supervisor: Callable[..., Proc]) -> None:
    sup = run_supervisor("start", "--redis-url", redis_url, "--queue", queue_name, "--handler",
                         "sup_jobs:record", "--health-port", str(free_port()), "--dashboard",
                         "--dashboard-actions", env={"ECHOMQ_DASHBOARD_TOKEN": ""})
    assert sup.proc.wait(30) == 2
    sup.reader.join(5)
    assert "ECHOMQ_DASHBOARD_TOKEN" in sup.output, sup.output
    assert "consumer" not in sup.output, sup.output  # nothing was forked


def test_dashboard_token_is_needed_and_never_shown(
        redis_url: str, queue_name: str, run_supervisor: Callable[..., Proc]) -> None:
    """The health port's dashboard with actions: refused without the token or with a wrong
    one, done with it; the token is in no page, error, metric or log line, and the
    consumers (handler code) do not inherit it."""
    port = free_port()
    here = Path(__file__).resolve().parent
    sup = run_supervisor(
        "start", "--redis-url", redis_url, "--queue", queue_name, "--handler",
        "sec_jobs:environ", "--health-port", str(port), "--dashboard", "--dashboard-actions",
        "--beat-ms", "100",
        env={"ECHOMQ_DASHBOARD_TOKEN": DASHBOARD_TOKEN,
             "PYTHONPATH": f"{here}{os.pathsep}{ROOT}"})
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: '"live"' in _body(base + "/livez"), 20, "the health port")
    q = echomq.Queue(queue_name, redis_url=redis_url)
    seen = q.add("env", {"name": "ECHOMQ_DASHBOARD_TOKEN"})
    assert q.result(seen, timeout=20) is None  # the handler's process has no token
    outputs: list[tuple[str, str]] = []
    pause = urllib.parse.urlencode({"action": "pause", "queue": queue_name}).encode()
    for headers in ({}, {"Authorization": "Bearer " + DASHBOARD_TOKEN[::-1]},
                    {"Cookie": "echomq_session=" + DASHBOARD_TOKEN}):
        code, body, _ = _request(base + "/action", pause, headers)
        assert code == 403, (headers, body)
        outputs.append((f"/action refused with {list(headers)}", body))
    assert not q.is_paused()
    code, body, _ = _request(base + "/action", pause,
                             {"Authorization": f"Bearer {DASHBOARD_TOKEN}"})
    assert code == 303 and q.is_paused(), body
    code, login, _ = _request(base + "/login")
    csrf = login.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    code, body, heads = _request(base + "/login", urllib.parse.urlencode(
        {"csrf": csrf, "token": DASHBOARD_TOKEN}).encode())
    assert code == 303, body
    session = heads["Set-Cookie"].split(";")[0]
    outputs.append(("the session cookie", heads["Set-Cookie"]))
    for page in ("/", f"/?queue={queue_name}", "/login", "/livez", "/readyz", "/metrics",
                 "/?queue=bad%20name", f"/?queue={queue_name}&job=no/such"):
        for headers in ({}, {"Cookie": session}):
            outputs.append((page, _request(base + page, None, headers)[1]))
    code, body, _ = _request(base + "/action", b"action=explode&queue=" + queue_name.encode(),
                             {"Authorization": f"Bearer {DASHBOARD_TOKEN}"})
    assert code == 400
    outputs.append(("a bad action's error", body))
    assert sup.stop() == 0
    outputs.append(("the supervisor's log", sup.output))
    for where, text in outputs:
        assert DASHBOARD_TOKEN not in text, f"the dashboard token reached {where}:\n{text}"
