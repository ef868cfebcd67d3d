"""Health and metrics over HTTP: /livez, /readyz, /metrics (Prometheus text format).

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
from echomq.supervisor.recycle import own_figures, rss_bytes
from echomq.supervisor.signals import sever

from echomq import scripts
from echomq.connection import client_from_url
from echomq.job import STATES
from echomq.keys import Keys

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class Health:
    """Owns the HTTP server; ``snapshot`` is the arbiter's view of itself."""

    def __init__(self, host: str, port: int, redis_url: str,
                 snapshot: Callable[[], dict[str, Any]], live_after_s: float) -> None:
        self.snapshot = snapshot
        self.live_after_s = live_after_s
        self.client = client_from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.server = ThreadingHTTPServer((host, port), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="echomq-health",
                                       daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def forget_in_child(self) -> None:
        """In a forked child: drop the listening socket without closing the parent's."""
        sever(self.server.socket)

    # --- the three answers ----------------------------------------------------------

    def livez(self) -> tuple[int, dict[str, Any]]:
        age = time.monotonic() - self.snapshot()["last_loop"]
        ok = age < self.live_after_s
        return (200 if ok else 503), {"live": ok, "loop_age_s": round(age, 3)}

    def readyz(self) -> tuple[int, dict[str, Any]]:
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
            if q["scheduler"] is not None:
                detail["queues"][name]["floor"] = q["scheduler"].get("floor", "n/a")
        detail["ready"] = ready
        return (200 if ready else 503), detail

    def metrics(self) -> str:
        snap = self.snapshot()
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str,
                   samples: list[tuple[dict[str, str], float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                label = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{name}{{{label}}} {value}" if label else f"{name} {value}")

        jobs, totals = [], []
        reachable = 1.0
        for name in snap["queues"]:
            try:
                values = scripts.counts(self.client, Keys(name))
            except redis.exceptions.RedisError:
                reachable = 0.0
                continue
            for state, value in zip(STATES, values[:5], strict=True):
                if state not in ("completed",):
                    jobs.append(({"queue": name, "state": state}, float(value)))
            totals += [({"queue": name, "outcome": "completed"}, float(values[3])),
                       ({"queue": name, "outcome": "retried"}, float(values[5])),
                       ({"queue": name, "outcome": "dead"}, float(values[4]))]
            jobs.append(({"queue": name, "state": "spilled"}, float(values[6])))
        metric("echomq_up", "gauge", "1 when Valkey answered this scrape", [({}, reachable)])
        metric("echomq_queue_jobs", "gauge", "Jobs per state (dead: currently dead)", jobs)
        metric("echomq_jobs_total", "counter", "Jobs finished per outcome since the queue began",
               totals)
        q = snap["queues"]
        metric("echomq_consumers", "gauge", "Consumer processes alive",
               [({"queue": n}, float(v["children"])) for n, v in q.items()])
        metric("echomq_consumers_busy", "gauge", "Consumer processes running jobs",
               [({"queue": n}, float(v["busy"])) for n, v in q.items()])
        metric("echomq_consumer_restarts_total", "counter", "Consumer processes respawned",
               [({"queue": n}, float(v["restarts"])) for n, v in q.items()])
        metric("echomq_valkey_available", "gauge",
               "1 while the queue's calls succeed; 0 while Valkey is unreachable or refuses "
               "writes", [({"queue": n}, 1.0 if v["healthy"] else 0.0) for n, v in q.items()])
        metric("echomq_valkey_refusals_total", "counter",
               "Calls Valkey refused, by error code (OOM, READONLY, NOREPLICAS, MISCONF, BUSY)",
               [({"queue": n, "code": c}, float(k)) for n, v in q.items()
                for c, k in sorted(v.get("refusals", {}).items())])
        metric("echomq_claim_to_start_seconds_sum", "counter",
               "Summed wait between a job's claim and its start",
               [({"queue": n}, v["claim_wait_us"] / 1e6) for n, v in q.items()])
        metric("echomq_claim_to_start_seconds_count", "counter", "Jobs started",
               [({"queue": n}, float(v["claim_jobs"])) for n, v in q.items()])
        metric("echomq_metronome_rings_total", "counter", "Doorbell rings taken",
               [({"queue": n}, float(v["rings"])) for n, v in q.items()])
        metric("echomq_promoted_total", "counter", "Deferred jobs promoted by this supervisor",
               [({"queue": n}, float(v["promoted"])) for n, v in q.items()])
        metric("echomq_reaped_total", "counter", "Expired leases reaped by this supervisor",
               [({"queue": n}, float(v["reaped"])) for n, v in q.items()])
        child_rss = [({"queue": n}, float(sum(rss_bytes(p) or 0 for p in v["pids"])))
                     for n, v in q.items()]
        metric("echomq_consumer_rss_bytes", "gauge", "Summed RSS of the consumer processes",
               child_rss)
        sched = [(n, v["scheduler"]) for n, v in q.items() if v["scheduler"] is not None]
        if sched:
            metric("echomq_floor_up", "gauge", "1 when the floor answered its last write",
                   [({"queue": n}, 1.0 if s.get("floor") == "ok" else 0.0) for n, s in sched])
            metric("echomq_floor_folded_total", "counter", "Jobs written to the floor",
                   [({"queue": n}, float(s.get("folded", 0))) for n, s in sched])
            metric("echomq_floor_backlog", "gauge", "Jobs waiting to be folded",
                   [({"queue": n}, float(s.get("backlog", 0))) for n, s in sched])
        own = own_figures()
        metric("echomq_supervisor_rss_bytes", "gauge", "Supervisor RSS", [({}, own["rss_bytes"])])
        metric("echomq_supervisor_cpu_seconds_total", "counter", "Supervisor CPU time",
               [({}, own["cpu_seconds"])])
        metric("echomq_supervisor_open_fds", "gauge", "Supervisor open fds",
               [({}, own["open_fds"])])
        return "\n".join(lines) + "\n"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.split("?")[0]
                if path == "/livez":
                    self._json(*health.livez())
                elif path == "/readyz":
                    self._json(*health.readyz())
                elif path == "/metrics":
                    body = health.metrics().encode()
                    self._send(200, CONTENT_TYPE_METRICS, body)
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _json(self, code: int, body: dict[str, Any]) -> None:
                self._send(code, "application/json", json.dumps(body).encode() + b"\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: probes every few seconds would drown the lifecycle log."""

        return Handler
