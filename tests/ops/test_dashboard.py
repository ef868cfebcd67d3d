"""The dashboard in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

Playwright rather than raw DevTools: it reports console messages and page errors as events,
waits for selectors and navigations with deadlines, and clicks like a user; the pip package
brings its own driver and is pointed at the system Chromium (``executable_path``), so no
browser is ever downloaded.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from echomq.supervisor.drills.localredis import free_port

import echomq

from .conftest import CONSOLE_SCRIPT, make_dead

CHROMIUM = os.environ.get("ECHOMQ_CHROMIUM", "/usr/bin/chromium")
TOKEN = "dash-Token-Sentinel-4711-abcdef"


def _need(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing (CI installs it: apt-get install chromium; "
                    "pip install playwright)")
    pytest.skip(f"{what} is missing")


class DashboardProcess:
    def __init__(self, redis_url: str, *flags: str, token: str | None = TOKEN) -> None:
        self.port = free_port()
        cmd = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [
            sys.executable, "-m", "echomq.ops.cli"]
        env = {k: v for k, v in os.environ.items() if k != "ECHOMQ_DASHBOARD_TOKEN"}
        if token is not None:
            env["ECHOMQ_DASHBOARD_TOKEN"] = token
        self.proc = subprocess.Popen(
            [*cmd, "--redis-url", redis_url, "dashboard", "--port", str(self.port), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the server is listening (or died)
        assert "echomq dashboard on http://127.0.0.1:" in line, line + self.proc.stdout.read()
        self.url = f"http://127.0.0.1:{self.port}/"

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(15)

    def post(self, path: str, form: dict[str, str], headers: dict[str, str] | None = None
             ) -> tuple[int, dict[str, str], str]:
        """POST a form without following the answer's redirect."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", path, urllib.parse.urlencode(form),
                         {"Content-Type": "application/x-www-form-urlencoded",
                          **(headers or {})})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, \
                resp.read().decode()
        finally:
            conn.close()

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(self.url.rstrip("/") + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()


@pytest.fixture
def dashboard(redis_url: str) -> Iterator[Any]:
    started: list[DashboardProcess] = []

    def start(*flags: str, token: str | None = TOKEN) -> DashboardProcess:
        started.append(DashboardProcess(redis_url, *flags, token=token))
        return started[-1]

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright")
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        _need(f"chromium ({CHROMIUM})")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(url, wait_until="load")
    return page, problems


def test_page_shows_counts_and_retry_moves_a_dead_job(browser: Any, dashboard: Any,
                                                      redis_url: str, queue_name: str,
                                                      tmp_path: Path) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    dead = make_dead(q, 2, "ValueError: mailbox full")
    q.add_many([("send", {"i": i}, {"lane": f"user-{i % 2}"}) for i in range(3)])
    q.add("later", None, delay=3600)
    d = dashboard("--allow-actions")
    page, problems = _open(browser, d.url + "?" + urllib.parse.urlencode({"queue": queue_name}))
    row = page.locator(f'#queues tr[data-queue="{queue_name}"]')
    counts = {c: row.locator(f'td[data-count="{c}"]').inner_text()
              for c in ("waiting", "scheduled", "dead")}
    assert counts == {"waiting": "3", "scheduled": "1", "dead": "2"}
    assert page.locator("#pause-state").inner_text() == "running"
    assert "mailbox full" in page.locator(f'#dead tr[data-job="{dead[0]}"]').inner_text()
    assert page.locator("#lanes").inner_text().count("user-") == 2
    # actions need the token: no button until the operator logs in with it
    assert page.locator("button[data-action]").count() == 0
    page.locator("#login").click()
    page.wait_for_url(re.compile(r".*/login$"))
    page.fill('input[name="token"]', "not-the-token-at-all")
    page.locator('#login-form button[type="submit"]').click()
    page.wait_for_url(re.compile(r".*/login\?failed=1$"))
    assert page.locator("#login-failed").inner_text() == "wrong dashboard token"
    page.fill('input[name="token"]', TOKEN)
    page.locator('#login-form button[type="submit"]').click()
    page.wait_for_url(d.url)
    cookie = next(c for c in page.context.cookies() if c["name"] == "echomq_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
    page.goto(d.url + "?" + urllib.parse.urlencode({"queue": queue_name}))
    assert TOKEN not in page.content()
    shot = Path(os.environ.get("ECHOMQ_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    page.locator(f'#dead tr[data-job="{dead[0]}"] button[data-action="retry"]').click()
    page.wait_for_url(re.compile(r".*notice=retried.*"))
    assert q.get(dead[0]).state == "waiting"  # type: ignore[union-attr]
    row = page.locator(f'#queues tr[data-queue="{queue_name}"]')
    assert row.locator('td[data-count="dead"]').inner_text() == "1"
    assert row.locator('td[data-count="waiting"]').inner_text() == "4"

    page.goto(d.url + "?" + urllib.parse.urlencode({"queue": queue_name, "job": dead[1]}))
    assert "mailbox full" in page.locator("#job").inner_text()
    page.locator('#queues button[data-action="pause"]').first.wait_for()
    row.locator('button[data-action="pause"]').click()
    page.wait_for_url(re.compile(r".*notice=paused.*"))
    assert q.is_paused() and page.locator("#pause-state").inner_text() == "paused"
    page.locator("#logout button").click()
    page.wait_for_url(d.url)
    assert page.locator("button[data-action]").count() == 0
    assert problems == []
    assert d.stop() == 0
    assert TOKEN not in d.proc.stdout.read()  # type: ignore[union-attr]


def test_read_only_page_has_no_buttons_and_refuses_posts(browser: Any, dashboard: Any,
                                                         redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    [dead] = make_dead(q, 1)
    d = dashboard()
    page, problems = _open(browser, d.url + "?" + urllib.parse.urlencode({"queue": queue_name}))
    assert page.locator(f'#dead tr[data-job="{dead}"]').count() == 1
    assert page.locator("button[data-action]").count() == 0
    assert page.locator('form[method="post"]').count() == 0
    page.fill('#lookup input[name="job"]', dead)  # looking a job up is not an action
    page.locator("#lookup button").click()
    page.wait_for_url(re.compile(f".*job={dead}.*"))
    assert page.locator("#job").get_attribute("data-job") == dead
    assert "read-only" in page.locator("header").inner_text()
    assert problems == []
    body = urllib.parse.urlencode({"action": "retry", "queue": queue_name, "job": dead}).encode()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(d.url + "action", data=body), timeout=10)
    assert err.value.code == 403
    assert q.get(dead).state == "dead"  # type: ignore[union-attr]


def test_actions_need_the_dashboard_token(dashboard: Any, redis_url: str,
                                         queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    [dead] = make_dead(q, 1)
    d = dashboard("--allow-actions")
    form = {"action": "retry", "queue": queue_name, "job": dead}
    # no token at all, a guessed form token, a wrong bearer token: refused, nothing done
    for headers, extra in (({}, {}), ({}, {"csrf": "guessed", "token": "guessed"}),
                           ({"Authorization": "Bearer wrong-token-wrong-token"}, {}),
                           ({"Authorization": f"Basic {TOKEN}"}, {})):
        code, _, body = d.post("/action", {**form, **extra}, headers)
        assert code == 403, (headers, body)
        assert TOKEN not in body
    assert q.get(dead).state == "dead"  # type: ignore[union-attr]
    # a login with the wrong token sets no cookie
    _, page = d.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None and TOKEN not in page
    code, heads, _ = d.post("/login", {"csrf": csrf[1], "token": "wrong-token-wrong-token"})
    assert code == 303 and heads["location"] == "/login?failed=1" and "set-cookie" not in heads
    assert d.post("/login", {"csrf": "guessed", "token": TOKEN})[0] == 403
    # the session cookie alone is not enough: a posted form needs the form token too
    code, heads, _ = d.post("/login", {"csrf": csrf[1], "token": TOKEN})
    assert code == 303 and TOKEN not in heads["set-cookie"]
    session = heads["set-cookie"].split(";")[0]
    assert d.post("/action", form, {"Cookie": session})[0] == 403
    assert d.post("/action", form, {"Cookie": "echomq_session=forged"})[0] == 403
    assert q.get(dead).state == "dead"  # type: ignore[union-attr]
    # the right bearer token acts (scripts and curl need no form token)
    code, heads, _ = d.post("/action", form, {"Authorization": f"Bearer {TOKEN}"})
    assert code == 303 and "notice=retried+1" in heads["location"]
    assert q.get(dead).state == "waiting"  # type: ignore[union-attr]
    # and so does a signed-in browser form
    code, heads, _ = d.post("/action", {"action": "pause", "queue": queue_name,
                                        "csrf": csrf[1]}, {"Cookie": session})
    assert code == 303 and q.is_paused()
    # GETs change nothing, whatever they carry
    assert d.get(f"/action?action=resume&queue={queue_name}",
                 {"Authorization": f"Bearer {TOKEN}"})[0] == 404
    assert q.is_paused()
    _, signed_in = d.get(f"/?queue={queue_name}", {"Cookie": session})
    assert 'data-action="resume"' in signed_in and TOKEN not in signed_in
    _, anonymous = d.get(f"/?queue={queue_name}")
    assert "data-action" not in anonymous and 'id="login"' in anonymous
    assert d.stop() == 0
    assert TOKEN not in d.proc.stdout.read()  # type: ignore[union-attr]


def test_allow_actions_without_a_token_refuses_to_start(redis_url: str) -> None:
    cmd = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [
        sys.executable, "-m", "echomq.ops.cli"]
    env = {k: v for k, v in os.environ.items() if k != "ECHOMQ_DASHBOARD_TOKEN"}
    for token in (None, "Tiny7"):
        run_env = env if token is None else {**env, "ECHOMQ_DASHBOARD_TOKEN": token}
        done = subprocess.run([*cmd, "--redis-url", redis_url, "dashboard", "--port",
                               str(free_port()), "--allow-actions"], capture_output=True,
                              text=True, timeout=30, env=run_env, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "ECHOMQ_DASHBOARD_TOKEN" in done.stderr
        assert "echomq dashboard on" not in done.stdout
        if token is not None:
            assert token not in done.stderr


def test_read_only_dashboard_needs_no_token(dashboard: Any, redis_url: str,
                                            queue_name: str) -> None:
    echomq.Queue(queue_name, redis_url=redis_url).add("x", {})
    d = dashboard(token=None)
    code, page = d.get(f"/?queue={queue_name}")
    assert code == 200 and "read-only" in page and 'id="login"' not in page
    assert d.get("/login")[0] == 404
    assert d.post("/action", {"action": "pause", "queue": queue_name},
                  {"Authorization": f"Bearer {TOKEN}"})[0] == 403


def test_the_queue_section_shows_the_queue_wide_limit(dashboard: Any, redis_url: str,
                                                      queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", {})
    d = dashboard(token=None)
    assert 'id="queue-limit"' not in d.get(f"/?queue={queue_name}")[1]
    q.set_queue_limit(max_active=7, rate=50, per_s=2)
    code, page = d.get(f"/?queue={queue_name}")
    assert code == 200 and "queue limit: at most 7 active, 50 starts per 2 s" in page


def test_page_follows_the_event_stream_without_reloading(browser: Any, dashboard: Any,
                                                         redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("send", {"i": 0})
    d = dashboard(token=None)
    page, problems = _open(browser, d.url + "?" + urllib.parse.urlencode({"queue": queue_name}))
    page.wait_for_function("document.getElementById('live-state').textContent === 'live'",
                           timeout=15_000)
    page.evaluate("window.notReloaded = true")
    row = page.locator(f'#queues tr[data-queue="{queue_name}"]')
    assert row.locator('td[data-count="waiting"]').inner_text() == "1"
    ids = q.add_many([("send", {"i": i}) for i in range(1, 4)])
    page.wait_for_function(
        f"""document.querySelector('#queues tr[data-queue="{queue_name}"] """
        """td[data-count="waiting"]').textContent === '4'""", timeout=15_000)
    echomq.Consumer(q, lambda job: None).run(burst=True)
    page.wait_for_function(
        f"""document.querySelector('#queues tr[data-queue="{queue_name}"] """
        """td[data-count="completed"]').textContent === '4'""", timeout=15_000)
    page.locator(f'#live-events li[data-kind="completed"][data-job="{ids[-1]}"]').wait_for(
        timeout=15_000)
    assert row.locator('td[data-count="waiting"]').inner_text() == "0"
    assert page.locator(f'#live-events li[data-job="{ids[0]}"][data-kind="added"]').count() == 1
    assert page.evaluate("window.notReloaded") is True, "updated in place, not reloaded"
    assert problems == []


def test_events_endpoint_refuses_a_bad_queue_name(dashboard: Any) -> None:
    d = dashboard(token=None)
    code, body = d.get("/events?queue=" + urllib.parse.quote("no spaces"))
    assert code == 400 and "invalid queue name" in body
