"""The dashboard: one server-side rendered page over the public Queue API.

``Dashboard.handle`` answers a request (method, path with query, form body)
with (status, content type, body); ``serve`` runs it on a standard-library
HTTP server (``echomq dashboard``), and the supervisor's health server mounts
the same object at ``/`` when started with ``--dashboard``. Read-only unless
built with ``allow_actions``, which needs the operator token
(``ECHOMQ_DASHBOARD_TOKEN``); then POST /action (retry, cancel, pause, resume)
must prove it: see :mod:`echomq.ops.access`. GETs never change anything.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import redis

from echomq import events
from echomq.connection import describe
from echomq.errors import EchoMQError
from echomq.keys import validate_job_id, validate_name
from echomq.ops import page
from echomq.ops.access import access_for
from echomq.ops.history import History
from echomq.ops.views import summary
from echomq.queue import Queue

Response = tuple[int, str, bytes, dict[str, str]]
HTML = "text/html; charset=utf-8"
DEAD_SHOWN = 20
ACTIONS = ("retry", "cancel", "pause", "resume")
TEXT = "text/plain; charset=utf-8"
PASSED_HEADERS = ("authorization", "cookie")  # what handle() reads of a request's headers
LIVE_EVENTS = 50  # events per live message, the newest (the page lists as many)
LIVE_PACE_S = 0.25
LIVE_BLOCK_MS = 5_000


class Dashboard:
    """Renders the page and performs the allowed actions for one server."""

    def __init__(self, client: redis.Redis, *, allow_actions: bool = False,
                 history: History | None = None, token: str | None = None,
                 live: bool = False) -> None:
        """The dashboard of the server ``client`` talks to.

        Args:
            client: the server's client.
            allow_actions: offer retry, cancel, pause and resume to token holders.
            history: the rates sampler (one is made when None).
            token: the operator token; default ``ECHOMQ_DASHBOARD_TOKEN``.
            live: the page follows the event stream (``/events``, served by
                :func:`serve`; the supervisor's one-answer server reloads instead).

        Raises:
            ConfigError: ``allow_actions`` without a token (see :func:`access_for`).
        """
        self.client = client
        self.allow_actions = allow_actions
        self.live = live
        self.access = access_for(allow_actions, token)
        self.where = describe(client)
        self.history = history or History(self._totals)

    def start(self) -> Dashboard:
        """Start sampling the throughput history; returns self."""
        self.history.start()
        return self

    def stop(self) -> None:
        """Stop sampling."""
        self.history.stop()

    def _totals(self) -> dict[str, dict[str, Any]]:
        return {name: Queue(name, redis=self.client).stats()
                for name in Queue.registered(self.client)}

    # --- requests ---------------------------------------------------------------------

    def handle(self, method: str, target: str, body: bytes = b"",
               headers: Mapping[str, str] | None = None) -> Response:
        """Answer one request. ``headers``: the request's, names in lower case (only
        ``authorization`` and ``cookie`` are read)."""
        url = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        heads = {k.lower(): v for k, v in (headers or {}).items()}
        try:
            if method == "GET" and url.path == "/":
                return self._ok(self.render(query.get("queue"), query.get("job"),
                                            query.get("notice", ""),
                                            signed_in=self._signed_in(heads)))
            if method == "GET" and url.path == "/login" and self.access is not None:
                return self._ok(page.login_page(self.where, self.access.form_token,
                                                failed="failed" in query))
            if method == "POST" and url.path in ("/action", "/login", "/logout"):
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                if url.path == "/login":
                    return self.login(form)
                if url.path == "/logout":
                    return self.logout(form)
                return self.act(form, heads)
        except (EchoMQError, ValueError) as exc:
            return 400, TEXT, f"{exc}\n".encode(), {}
        except redis.exceptions.RedisError as exc:
            return 503, TEXT, f"Valkey/Redis at {self.where}: {exc}\n".encode(), {}
        return 404, TEXT, b"not found\n", {}

    def _ok(self, text: str) -> Response:
        return 200, HTML, text.encode(), {"Cache-Control": "no-store"}

    def _signed_in(self, headers: Mapping[str, str]) -> bool:
        return self.access is not None and self.access.session_ok(headers)

    def render(self, queue: str | None = None, job_id: str | None = None,
               notice: str = "", *, signed_in: bool = False) -> str:
        """The page; buttons (with the form token) only for a signed-in operator."""
        token = self.access.form_token if self.access is not None and signed_in else None
        names = Queue.registered(self.client)
        rows = [summary(Queue(n, redis=self.client)) for n in names]
        parts = [page.queues_table(rows, token)]
        selected = queue or (names[0] if names else None)
        if selected:
            q = Queue(validate_name(selected), redis=self.client)
            s = summary(q, top_lanes=10)
            parts.append(page.queue_detail(s, self.history.rates(q.name),
                                           q.jobs("dead", limit=DEAD_SHOWN), token,
                                           live=self.live))
            if job_id:
                parts.insert(1, page.job_detail(q.name, q.get(validate_job_id(job_id)), token))
        account = ""
        if self.access is not None:
            account = page.logout_form(self.access.form_token) if signed_in else \
                page.login_link()
        return page.page(self.where, self.allow_actions, "".join(parts),
                         refresh=not job_id, notice=notice, account=account,
                         live=self.live and bool(selected))

    def login(self, form: dict[str, str]) -> Response:
        """POST /login: the token from the login form opens a session (a cookie)."""
        if self.access is None:
            return 404, TEXT, b"not found\n", {}
        if not self.access.form_ok(form):
            return 403, TEXT, b"stale or missing form token: reload the login page\n", {}
        if not self.access.token_ok(form.get("token", "")):
            # back to the form, saying so (the token typed is not echoed anywhere)
            return 303, TEXT, b"wrong dashboard token\n", {"Location": "/login?failed=1"}
        return 303, TEXT, b"", {"Location": "/", "Set-Cookie": self.access.login_cookie()}

    def logout(self, form: dict[str, str]) -> Response:
        """POST /logout: end the session."""
        if self.access is None:
            return 404, TEXT, b"not found\n", {}
        if not self.access.form_ok(form):
            return 403, TEXT, b"stale or missing form token: reload\n", {}
        return 303, TEXT, b"", {"Location": "/", "Set-Cookie": self.access.logout_cookie()}

    def act(self, form: dict[str, str], headers: Mapping[str, str] | None = None) -> Response:
        """POST /action: retry, cancel, pause or resume, for a holder of the token."""
        heads = {k.lower(): v for k, v in (headers or {}).items()}
        if self.access is None:
            return 403, TEXT, b"read-only: start the dashboard with --allow-actions (and " \
                b"ECHOMQ_DASHBOARD_TOKEN) to retry, cancel, pause or resume\n", {}
        if not self.access.bearer_ok(heads):
            if "authorization" in heads:
                return 403, TEXT, b"wrong dashboard token\n", {}
            if not self.access.session_ok(heads):
                return 403, TEXT, b"actions need the dashboard token: log in at /login, or " \
                    b"send Authorization: Bearer <token>\n", {}
            if not self.access.form_ok(form):
                return 403, TEXT, b"stale or missing form token: reload\n", {}
        action = form.get("action", "")
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        q = Queue(validate_name(form.get("queue")), redis=self.client)
        job = form.get("job", "")
        if action == "retry":
            n = q.retry_dead([validate_job_id(job)] if job else None)
            notice = f"retried {n} job(s)"
        elif action == "cancel":
            done = q.cancel(validate_job_id(job))
            notice = f"cancelled {job}" if done else f"{job} could not be cancelled"
        elif action == "pause":
            q.pause()
            notice = f"paused {q.name}"
        else:
            q.resume()
            notice = f"resumed {q.name}"
        where = "/?" + urlencode({"queue": q.name, "notice": notice})
        return 303, TEXT, b"", {"Location": where}


    def stream(self, target: str, last_event_id: str | None = None) -> Iterator[bytes]:
        """GET /events?queue=NAME: server-sent events, one message per batch of the
        queue's job events read from its stream: ``{"counts": ..., "events": [...]}``
        (at most LIVE_EVENTS of the newest), with the last event's id, so a browser that
        reconnects (Last-Event-ID) goes on where it left. Starts with the current counts;
        a comment every few seconds finds a closed connection."""
        query = {k: v[0] for k, v in parse_qs(urlsplit(target).query).items()}
        q = Queue(validate_name(query.get("queue")), redis=self.client)
        if last_event_id:
            events.check_args(last_event_id, None)
            last = last_event_id
        else:  # from now on: after the newest entry there is
            newest = self.client.xrevrange(q.keys.events, count=1)
            last = newest[0][0].decode() if newest else "0"
        yield _sse({"counts": q.counts(), "events": []})
        while True:
            batch = list(q.events(since=last, block_s=0))
            if batch:
                last = batch[-1].id
                yield _sse({"counts": q.counts(),
                            "events": [e.to_dict() for e in batch[-LIVE_EVENTS:]]}, last)
                # paced, not polling: the XREAD above blocks until an event comes; this
                # pause only caps a page at a few updates a second (no event marks "a
                # page is ready for more"); the events wait in the stream meanwhile
                time.sleep(LIVE_PACE_S)
                continue
            entry = last.rsplit("-", 1)[0] if last.count("-") == 2 else last
            if not self.client.xread({q.keys.events: entry}, count=1, block=LIVE_BLOCK_MS):
                yield b": idle\n\n"


def _sse(data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def request_headers(headers: Any) -> dict[str, str]:
    """The request headers :meth:`Dashboard.handle` reads, from http.server's ``headers``."""
    return {name: value for name in PASSED_HEADERS
            if (value := headers.get(name)) is not None}


def handler_class(dashboard: Dashboard) -> type[BaseHTTPRequestHandler]:
    """An http.server request handler class that answers through ``dashboard``."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if dashboard.live and urlsplit(self.path).path == "/events":
                self._stream()
                return
            self._answer("GET", b"")

        def _stream(self) -> None:
            try:
                chunks = dashboard.stream(self.path, self.headers.get("Last-Event-ID"))
                first = next(chunks)
            except (EchoMQError, ValueError) as exc:
                self._answer_with(400, TEXT, f"{exc}\n".encode(), {})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            try:
                self.wfile.write(first)
                self.wfile.flush()
                for chunk in chunks:
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (OSError, redis.exceptions.RedisError):
                return  # the browser went away (or the server did: it reconnects)

        def do_POST(self) -> None:  # noqa: N802
            length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
            self._answer("POST", self.rfile.read(length))

        def _answer(self, method: str, body: bytes) -> None:
            self._answer_with(*dashboard.handle(method, self.path, body,
                                                request_headers(self.headers)))

        def _answer_with(self, code: int, ctype: str, payload: bytes,
                         headers: dict[str, str]) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the page refreshes itself every few seconds."""

    return Handler


def serve(client: redis.Redis, host: str, port: int, *, allow_actions: bool = False) -> None:
    """Serve the dashboard until SIGINT or SIGTERM.

    Raises:
        ConfigError: ``allow_actions`` without ``ECHOMQ_DASHBOARD_TOKEN``.
    """
    dashboard = Dashboard(client, allow_actions=allow_actions, live=True).start()
    server = ThreadingHTTPServer((host, port), handler_class(dashboard))
    server.daemon_threads = True
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()  # recorded only; the main thread shuts the server down

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, name="echomq-dashboard", daemon=True)
    thread.start()
    print(f"echomq dashboard on http://{host}:{server.server_address[1]}/ "
          f"({'actions allowed' if allow_actions else 'read-only'}), {dashboard.where}",
          flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    dashboard.stop()
