"""Health and metrics over HTTP: /livez, /readyz, /metrics (prometheus_client), and the
dashboard at / when asked for.

Served by :mod:`echomq.supervisor.httpd` from its own threads with its own Redis client, so
a slow scrape never holds up the main loop; it only reads the arbiter's snapshot. /livez
is answered on the server's loop and never waits on Valkey; /readyz, /metrics and the
dashboard run on its workers, so slow clients and a slow Valkey never hold a probe up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis
from echomq.supervisor.httpd import Request, Response, Server
from echomq.supervisor.metrics import build_registry
from echomq.supervisor.observations import Tally
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq.connection import client_from_url
from echomq.ops.dashboard import PASSED_HEADERS

CONTENT_TYPE_METRICS = CONTENT_TYPE_LATEST
REQUEST_TIMEOUT_S = 5.0  # a connection's request and answer must be done by then
MAX_CONNECTIONS = 256  # open at once; a new one drops the oldest still sending its request


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
        # one attempt per call: a probe says what it finds now (redis-py's retries, a cluster
        # client's slot-map refreshes between them, took seconds per call with a master down)
        self.client = client_from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                      retry=Retry(NoBackoff(), 0))
        self.registry = build_registry(snapshot, self.client, tally)
        self.dashboard: Any = None
        if dashboard:
            from echomq.ops.dashboard import Dashboard

            # actions need ECHOMQ_DASHBOARD_TOKEN: without it this raises ConfigError
            self.dashboard = Dashboard(client_from_url(redis_url, socket_timeout=5.0),
                                       allow_actions=dashboard_actions)
        self.server = Server(host, port, self.quick, self.slow, timeout_s=request_timeout_s,
                             max_connections=max_connections)
        self.started = False

    @property
    def port(self) -> int:
        """The port the server is bound to (the one chosen when asked for 0)."""
        return int(self.server.port)

    def open_connections(self) -> int:
        """Connections open now (being read, answered or waiting for their answer)."""
        return len(self.server.conns)

    @property
    def most_connections(self) -> int:
        """The most connections open at once so far."""
        return int(self.server.most)

    def start(self) -> None:
        """Serve in background threads."""
        self.server.start()
        if self.dashboard is not None:
            self.dashboard.start()
        self.started = True

    def stop(self) -> None:
        """Stop serving, close the listener and every connection, end the threads, close
        the Valkey connections."""
        if self.dashboard is not None and self.started:
            self.dashboard.stop()
        self.started = False
        self.server.stop()
        self.client.close()
        if self.dashboard is not None:
            self.dashboard.client.close()

    def forget_in_child(self) -> None:
        """In a forked child: drop the inherited sockets without closing the parent's."""
        self.server.forget_in_child()

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
            if q["scheduler"] is not None and "outbox" in q["scheduler"]:
                # shown, not a reason to be unready: the consumers serve what is admitted
                detail["queues"][name]["outbox"] = q["scheduler"]["outbox"]
        detail["ready"] = ready
        return (200 if ready else 503), detail

    def metrics(self) -> bytes:
        """`/metrics`: the registry in Prometheus' text format."""
        return generate_latest(self.registry)

    # --- routing ------------------------------------------------------------------------

    def quick(self, request: Request) -> Response | None:
        """The answers that never block, given on the server's loop; None for the rest."""
        if request.method == "GET":
            if request.path == "/livez":
                return _json(*self.livez())
            if request.path in ("/readyz", "/metrics") or self.dashboard is not None:
                return None
            return NOT_FOUND
        if request.method == "POST":
            return None if self.dashboard is not None else NOT_FOUND
        return 501, "text/plain", f"unsupported method {request.method!r}\n".encode(), {}

    def slow(self, request: Request) -> Response:
        """The answers that may wait on Valkey, given on the server's workers."""
        if request.path == "/readyz" and request.method == "GET":
            return _json(*self.readyz())
        if request.path == "/metrics" and request.method == "GET":
            return 200, CONTENT_TYPE_METRICS, self.metrics(), {}
        headers = {k: v for k in PASSED_HEADERS if (v := request.headers.get(k)) is not None}
        code, ctype, body, extra = self.dashboard.handle(request.method, request.target,
                                                         request.body, headers)
        return code, ctype, body, dict(extra)


NOT_FOUND: Response = (404, "text/plain", b"not found\n", {})


def _json(code: int, body: dict[str, Any]) -> Response:
    return code, "application/json", json.dumps(body).encode() + b"\n", {}
