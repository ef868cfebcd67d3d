"""Health and metrics over HTTP: /livez, /readyz, /metrics (prometheus_client), and the
dashboard at / when asked for.

Served from a daemon thread with its own Redis client, so a slow scrape never
holds up the main loop; it only reads the arbiter's snapshot.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis
from echomq.supervisor.metrics import build_registry
from echomq.supervisor.observations import Tally
from echomq.supervisor.signals import sever
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from echomq.connection import client_from_url
from echomq.ops.dashboard import request_headers

CONTENT_TYPE_METRICS = CONTENT_TYPE_LATEST
REQUEST_TIMEOUT_S = 5.0  # a request that has not arrived by then is dropped
MAX_CONNECTIONS = 16  # requests served at once; more wait in the listen backlog


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per request, but at most ``max_connections`` of them: the accept loop
    waits for a free slot, so half-sent requests cannot pile up threads."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.open = self.most = 0
        self.count_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Take a connection slot (waiting while all are busy), then serve on a thread."""
        self.slots.acquire()  # frees within REQUEST_TIMEOUT_S: every socket has a timeout
        with self.count_lock:
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection on its thread, then free its slot."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self.count_lock:
            self.open -= 1
        self.slots.release()




class Health:
    """Owns the HTTP server; ``snapshot`` is the arbiter's view of itself."""

    def __init__(self, host: str, port: int, redis_url: str,
                 snapshot: Callable[[], dict[str, Any]], live_after_s: float, *,
                 tally: Tally | None = None, dashboard: bool = False,
                 dashboard_actions: bool = False, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.request_timeout_s = request_timeout_s
        self.snapshot = snapshot
        self.live_after_s = live_after_s
        self.client = client_from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.registry = build_registry(snapshot, self.client, tally)
        self.dashboard: Any = None
        if dashboard:
            from echomq.ops.dashboard import Dashboard

            # actions need ECHOMQ_DASHBOARD_TOKEN: without it this raises ConfigError
            self.dashboard = Dashboard(client_from_url(redis_url, socket_timeout=5.0),
                                       allow_actions=dashboard_actions)
        self.server = BoundedHTTPServer((host, port), self._handler_class(), max_connections)
        self.thread = threading.Thread(target=self.server.serve_forever, name="echomq-health",
                                       daemon=True)

    @property
    def port(self) -> int:
        """The port the server is bound to (the one chosen when asked for 0)."""
        return int(self.server.server_address[1])

    def open_connections(self) -> int:
        """Requests being served now."""
        return self.server.open

    @property
    def most_connections(self) -> int:
        """The most requests served at once so far."""
        return self.server.most

    def start(self) -> None:
        """Serve in a background thread; returns self."""
        self.thread.start()
        if self.dashboard is not None:
            self.dashboard.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self.dashboard is not None:
            self.dashboard.stop()
        self.server.shutdown()
        self.server.server_close()

    def forget_in_child(self) -> None:
        """In a forked child: drop the listening socket without closing the parent's."""
        sever(self.server.socket)

    # --- the three answers ----------------------------------------------------------

    def livez(self) -> tuple[int, dict[str, Any]]:
        """`/livez`: 200 while the arbiter's loop turned recently, 503 once it stalls."""
        age = time.monotonic() - self.snapshot()["last_loop"]
        ok = age < self.live_after_s
        return (200 if ok else 503), {"live": ok, "loop_age_s": round(age, 3)}

    def readyz(self) -> tuple[int, dict[str, Any]]:
        """`/readyz`: 200 when Valkey answers and each queue has a ready consumer and takes
        writes, else 503 with the reason."""
        snap = self.snapshot()
        detail: dict[str, Any] = {"stopping": snap["stopping"], "queues": {}}
        try:
            self.client.ping()
            detail["valkey"] = "ok"
        except redis.exceptions.RedisError as exc:
            detail["valkey"] = f"unreachable: {exc}"
        ready = detail["valkey"] == "ok" and not snap["stopping"]
        for name, q in snap["queues"].items():
            detail["queues"][name] = {
                "children": q["ready_children"], "processes": q["processes"],
                "healthy": q["healthy"], "valkey": q.get("valkey", "ok"),
            }
            if q["ready_children"] < 1 or not q["healthy"]:
                ready = False  # e.g. Valkey refusing writes: PING alone would not show it
            if q["scheduler"] is not None and q["scheduler"].get("floor") != "none":
                detail["queues"][name]["floor"] = q["scheduler"].get("floor", "n/a")
        detail["ready"] = ready
        return (200 if ready else 503), detail

    def metrics(self) -> bytes:
        """`/metrics`: the registry in Prometheus' text format."""
        return generate_latest(self.registry)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        health = self

        class Handler(BaseHTTPRequestHandler):
            timeout = health.request_timeout_s  # socket timeout for every read and write

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.split("?")[0]
                if path == "/livez":
                    self._json(*health.livez())
                elif path == "/readyz":
                    self._json(*health.readyz())
                elif path == "/metrics":
                    self._send(200, CONTENT_TYPE_METRICS, health.metrics())
                elif health.dashboard is not None:
                    self._send(*health.dashboard.handle("GET", self.path, b"",
                                                        request_headers(self.headers)))
                else:
                    self._send(404, "text/plain", b"not found\n")

            def do_POST(self) -> None:  # noqa: N802
                if health.dashboard is None:
                    self._send(404, "text/plain", b"not found\n")
                    return
                length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
                self._send(*health.dashboard.handle("POST", self.path, self.rfile.read(length),
                                                    request_headers(self.headers)))

            def _json(self, code: int, body: dict[str, Any]) -> None:
                self._send(code, "application/json", json.dumps(body).encode() + b"\n")

            def _send(self, code: int, ctype: str, body: bytes,
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: probes every few seconds would drown the lifecycle log."""

        return Handler
