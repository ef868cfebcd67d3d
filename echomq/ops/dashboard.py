"""The dashboard: one server-side rendered page over the public Queue API.

``Dashboard.handle`` answers a request (method, path with query, form body)
with (status, content type, body); ``serve`` runs it on a standard-library
HTTP server (``echomq dashboard``), and the supervisor's health server mounts
the same object at ``/`` when started with ``--dashboard``. Read-only unless
built with ``allow_actions``; then POST /action (retry, cancel, pause, resume)
must carry the per-process form token, so another site cannot post to it.
"""

from __future__ import annotations

import secrets
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import redis

from echomq.connection import describe
from echomq.errors import EchoMQError
from echomq.keys import validate_job_id, validate_name
from echomq.ops import page
from echomq.ops.history import History
from echomq.ops.views import summary
from echomq.queue import Queue

Response = tuple[int, str, bytes, dict[str, str]]
HTML = "text/html; charset=utf-8"
DEAD_SHOWN = 20
ACTIONS = ("retry", "cancel", "pause", "resume")


class Dashboard:
    """Renders the page and performs the allowed actions for one server."""

    def __init__(self, client: redis.Redis, *, allow_actions: bool = False,
                 history: History | None = None) -> None:
        self.client = client
        self.allow_actions = allow_actions
        self.token = secrets.token_urlsafe(16)
        self.where = describe(client)
        self.history = history or History(self._totals)

    def start(self) -> Dashboard:
        self.history.start()
        return self

    def stop(self) -> None:
        self.history.stop()

    def _totals(self) -> dict[str, dict[str, Any]]:
        return {name: Queue(name, redis=self.client).stats()
                for name in Queue.registered(self.client)}

    # --- requests ---------------------------------------------------------------------

    def handle(self, method: str, target: str, body: bytes = b"") -> Response:
        url = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            if method == "GET" and url.path == "/":
                return self._ok(self.render(query.get("queue"), query.get("job"),
                                            query.get("notice", "")))
            if method == "POST" and url.path == "/action":
                return self.act({k: v[0] for k, v in parse_qs(body.decode()).items()})
        except (EchoMQError, ValueError) as exc:
            return 400, "text/plain; charset=utf-8", f"{exc}\n".encode(), {}
        except redis.exceptions.RedisError as exc:
            return (503, "text/plain; charset=utf-8",
                    f"Valkey/Redis at {self.where}: {exc}\n".encode(), {})
        return 404, "text/plain; charset=utf-8", b"not found\n", {}

    def _ok(self, text: str) -> Response:
        return 200, HTML, text.encode(), {"Cache-Control": "no-store"}

    def render(self, queue: str | None = None, job_id: str | None = None,
               notice: str = "") -> str:
        token = self.token if self.allow_actions else None
        names = Queue.registered(self.client)
        rows = [summary(Queue(n, redis=self.client)) for n in names]
        parts = [page.queues_table(rows, token)]
        selected = queue or (names[0] if names else None)
        if selected:
            q = Queue(validate_name(selected), redis=self.client)
            s = summary(q, top_lanes=10)
            parts.append(page.queue_detail(s, self.history.rates(q.name),
                                           q.jobs("dead", limit=DEAD_SHOWN), token))
            if job_id:
                parts.insert(1, page.job_detail(q.name, q.get(validate_job_id(job_id)), token))
        return page.page(self.where, self.allow_actions, "".join(parts),
                         refresh=not job_id, notice=notice)

    def act(self, form: dict[str, str]) -> Response:
        if not self.allow_actions:
            return 403, "text/plain; charset=utf-8", b"read-only: start the dashboard with " \
                b"--allow-actions to retry, cancel, pause or resume\n", {}
        if not secrets.compare_digest(form.get("token", ""), self.token):
            return 403, "text/plain; charset=utf-8", b"stale or missing form token: reload\n", {}
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
        return 303, "text/plain; charset=utf-8", b"", {"Location": where}


def handler_class(dashboard: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._answer("GET", b"")

        def do_POST(self) -> None:  # noqa: N802
            length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
            self._answer("POST", self.rfile.read(length))

        def _answer(self, method: str, body: bytes) -> None:
            code, ctype, payload, headers = dashboard.handle(method, self.path, body)
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
    """Serve the dashboard until SIGINT or SIGTERM."""
    dashboard = Dashboard(client, allow_actions=allow_actions).start()
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
