"""Passwords as password generators make them (``#``, ``/``, ``?``, ``@``, ``:`` inside), in
every place a URL carries one (userinfo, ``?password=``, ``?sentinel_password=``,
``?ssl_password=``, libpq's ``?sslpassword=``), unencoded or percent-encoded, never reach
an output: ``redact_url`` itself, the supervisor's log, ``repr(Queue)``, ``aio.Queue``,
the ``echomq`` CLI and its dashboard, ``Queue()`` and floor errors. No piece of the
password shows, and the rest of the URL stays readable."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis, free_port

import echomq
from echomq.connection import redact_url
from echomq.errors import EchoMQError
from echomq.floor import Floor
from echomq.floor import redact_url as redact_floor_url

from .conftest import Proc, wait_until

PIECES = ["Alpha7", "Bravo8", "Charlie9", "Delta0", "Echo1", "Foxtrot2"]
PASSWORD = "Alpha7#Bravo8/Charlie9?Delta0@Echo1:Foxtrot2"
ENCODED = quote(PASSWORD, safe="")


def _clean(text: str, where: str) -> None:
    leaked = [p for p in PIECES if p in text]
    assert not leaked, f"password pieces {leaked} reached {where}:\n{text}"


def _formatted(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def _urls(port: int, password: str, tls: bool = True) -> list[str]:
    """Every place a Valkey URL carries a password, with ``password`` as given (``tls``:
    with the rediss:// ones, for a port where no plain server would take a handshake)."""
    host = f"127.0.0.1:{port}"
    urls = [
        f"redis://worker:{password}@{host}/0",
        f"redis://:{password}@{host}/0",
        f"redis://{host}/0?username=worker&password={password}",
        f"redis://{host}/0?password={password}&socket_timeout=5",
        f"redis+sentinel://worker:{password}@{host},127.0.0.2:26380/mymaster/0"
        f"?sentinel_password={password}",
        f"unix://worker:{password}@/run/valkey/valkey.sock?db=0",
    ]
    if tls:
        urls += [f"rediss://worker:{password}@{host}/0?ssl_ca_certs=/etc/echomq/ca.pem",
                 f"rediss://{host}/0?ssl_password={password}&ssl_ca_certs=/etc/ca.pem"]
    return urls


FLOOR_URLS = [
    f"postgresql://echomq:{PASSWORD}@127.0.0.1:5432/echomq",
    f"postgresql+psycopg://echomq:{ENCODED}@127.0.0.1:5432/echomq",
    f"postgresql://echomq@127.0.0.1:5432/echomq?sslpassword={PASSWORD}",
    f"postgresql://127.0.0.1:5432/echomq?user=echomq&password={PASSWORD}",
]


@pytest.mark.parametrize("password", [PASSWORD, ENCODED], ids=["raw", "encoded"])
def test_redact_url_hides_every_piece_and_keeps_the_rest(password: str) -> None:
    for url in _urls(6390, password):
        shown = redact_url(url)
        _clean(shown, f"redact_url({url!r})")
        assert "***" in shown, shown
        scheme = url.partition("://")[0]
        assert shown.startswith(scheme + "://"), shown
        if scheme != "unix":
            assert "127.0.0.1:6390" in shown, shown
        assert "/0" in shown or "db=0" in shown, shown
        if "worker:" in url:
            assert "worker:***@" in shown, shown
        if "ssl_ca_certs=" in url:
            assert "ssl_ca_certs=/etc/" in shown, shown
    # an unencoded '&' splits the value: the pieces without '=' after it are hidden too
    assert redact_url("redis://h:1/0?password=Alpha7&Bravo8&db=1") == (
        "redis://h:1/0?password=***&***&db=1")
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("redis://worker@127.0.0.1:6379/0") == "redis://worker@127.0.0.1:6379/0"
    assert redact_url("not a url") == "not a url"


def test_floor_urls_are_redacted_by_parsing_too() -> None:
    for url in FLOOR_URLS:
        shown = redact_floor_url(url)
        _clean(shown, f"floor redact_url({url!r})")
        assert "127.0.0.1:5432" in shown and "echomq" in shown, shown


@pytest.fixture
def protected() -> Iterator[LocalRedis]:
    """A server whose user "worker" has the password PASSWORD."""
    server = LocalRedis().start()
    redis.Redis(port=server.port).execute_command(
        "ACL", "SETUSER", "worker", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    yield server
    server.stop()


def test_queue_repr_and_errors_hold_no_piece(protected: LocalRedis) -> None:
    good = f"redis://worker:{ENCODED}@127.0.0.1:{protected.port}/0"
    q = echomq.Queue("redact", redis_url=good)
    q.add("x", {})  # a percent-encoded password works
    _clean(repr(q), "repr(Queue)")
    for url in [*_urls(protected.port, PASSWORD, tls=False), *_urls(free_port(), ENCODED)]:
        seen = ""
        try:
            q = echomq.Queue("redact", redis_url=url)
            seen += repr(q)
            q.add("x", {})
        except EchoMQError as exc:
            seen += _formatted(exc)
        _clean(seen, f"Queue({url!r})")


def test_aio_queue_repr_and_errors_hold_no_piece(protected: LocalRedis) -> None:
    async def run(url: str) -> str:
        seen = ""
        try:
            aq = echomq.aio.Queue("redact", redis_url=url)
            seen += repr(aq)
            try:
                await aq.add("x", {})
            finally:
                await aq.close()
        except EchoMQError as exc:
            seen += _formatted(exc)
        return seen

    for url in [*_urls(protected.port, PASSWORD, tls=False), *_urls(free_port(), ENCODED)]:
        _clean(asyncio.run(run(url)), f"aio.Queue({url!r})")


def test_floor_errors_hold_no_piece() -> None:
    for url in FLOOR_URLS:
        url = url.replace("5432", str(free_port()))
        seen = ""
        try:
            floor = Floor.from_url(url, connect_timeout_s=2)
            seen += repr(floor)
            floor.check_at_head()
        except EchoMQError as exc:
            seen += _formatted(exc)
        _clean(seen, f"the floor at {url!r}")


def test_cli_and_its_dashboard_hold_no_piece(protected: LocalRedis) -> None:
    urls = [f"redis://worker:{ENCODED}@127.0.0.1:{protected.port}/0",
            *_urls(protected.port, PASSWORD, tls=False), *_urls(free_port(), ENCODED)]
    for url in urls:
        for argv in (["queues"], ["--json", "stats", "redact"]):
            done = subprocess.run([sys.executable, "-m", "echomq.ops.cli", "--redis-url", url,
                                   *argv], capture_output=True, text=True, timeout=60)
            _clean(done.stdout + done.stderr, f"echomq {' '.join(argv)} at {url!r}")
    for url in (urls[0], urls[1]):
        port = free_port()
        board = subprocess.Popen(
            [sys.executable, "-m", "echomq.ops.cli", "dashboard", "--port", str(port)],
            env={**os.environ, "ECHOMQ_REDIS_URL": url}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            page = _page_or_exit(board, port)
        finally:
            board.terminate()
            out, _ = board.communicate(timeout=20)
        _clean(page + out, f"echomq dashboard at {url!r}")
        if url == urls[0]:  # the working URL: the page was served, naming the server
            assert "127.0.0.1" in page and "127.0.0.1" in out, (page, out)


def _page_or_exit(board: subprocess.Popen[str], port: int) -> str:
    """The dashboard's page once it serves, or "" when the process ended first."""
    import urllib.error
    import urllib.request

    page: list[str] = []

    def served() -> bool:
        if board.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                page.append(resp.read().decode())
            return True
        except (urllib.error.URLError, ConnectionError):
            return False

    wait_until(served, 20, "the dashboard")
    return "".join(page)


@pytest.mark.parametrize("password", [ENCODED, PASSWORD], ids=["encoded", "raw"])
def test_supervisor_log_holds_no_piece(
        protected: LocalRedis, queue_name: str, run_supervisor: Callable[..., Proc],
        password: str) -> None:
    url = f"redis://worker:{password}@127.0.0.1:{protected.port}/0"
    floor = f"postgresql://echomq:{password}@127.0.0.1:{free_port()}/echomq"
    sup = run_supervisor("start", "--queue", queue_name, "--handler", "sup_jobs:record",
                         "--beat-ms", "100",
                         env={"ECHOMQ_REDIS_URL": url, "ECHOMQ_FLOOR_URL": floor,
                              "ECHOMQ_TEST_LEDGER_URL": "redis://unused"})
    if password == ENCODED:
        sup.wait_for("supervisor started", 30)  # the URL works, and is logged redacted
        assert "worker:***@127.0.0.1" in sup.output, sup.output
    else:
        wait_until(lambda: sup.proc.poll() is not None or "percent-encode" in sup.output,
                   30, "the supervisor to refuse the URL")
    sup.stop()
    _clean(sup.output, "the supervisor's log")
