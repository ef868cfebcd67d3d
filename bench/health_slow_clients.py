"""/livez and /readyz latency on the supervisor's health port while slow clients hold it.

    .venv/bin/python bench/health_slow_clients.py              # 200 slow clients, 200 probes
    .venv/bin/python bench/health_slow_clients.py --slow 0,200 --json -

A real supervisor (one consumer, private server) serves ``--health-port``. A client thread
keeps ``--slow`` connections open to it, half sending a request line and headers but never
the blank line, half sending nothing; each one the server closes is opened again at once.
Meanwhile probes ask /livez and /readyz in turn, ``--gap-ms`` apart, each on a new
connection with a ``--timeout`` as a kubelet's probe has; a probe that gets no answer in
time counts as its timeout. Prints p50/p99/max per path and how many probes took over 1 s.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import benchlib as bl
from echomq.supervisor.drills.localredis import free_port

HALF_SENT = b"GET /livez HTTP/1.1\r\nHost: slow\r\n"


class SlowClients:
    """``count`` connections held open from one thread, each reopened when closed."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.reopened = 0
        self.connected = 0
        self.all_connected = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SlowClients:
        if not self.count:
            self.all_connected.set()
        for i in range(self.count):
            self._open(HALF_SENT if i % 2 else b"")
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()

    def _open(self, first: bytes) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.sel.register(s, selectors.EVENT_WRITE, first)

    def _run(self) -> None:
        while not self.stop.is_set():
            for key, mask in self.sel.select(0.2):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                first: bytes = key.data
                if mask & selectors.EVENT_WRITE:  # connected (or refused)
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        try:
                            if first:
                                s.send(first)
                            self.sel.modify(s, selectors.EVENT_READ, first)
                            self.connected += 1
                            if self.connected >= self.count:
                                self.all_connected.set()
                            continue
                        except OSError:
                            pass
                else:
                    try:
                        if s.recv(4096):
                            continue  # an answer (to a request never finished: none expected)
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                self.sel.unregister(s)  # closed by the server: open another
                s.close()
                self.reopened += 1
                self._open(first)


def probe(port: int, path: str, timeout: float) -> float:
    """Seconds to a full answer; ``timeout`` when none came in time."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError:
        pass  # an answer all the same (503 before the consumer is ready)
    except OSError:
        return timeout
    return time.perf_counter() - t0


def measure(slow: int, probes: int, gap_s: float, timeout: float,
            budget_s: float) -> dict[str, Any]:
    with bl.private_redis() as server:
        port = free_port()
        proc = bl.start_supervisor(server.url, bl.unique_queue("health"), "handlers:noop", 1,
                                   extra=["--health-port", str(port)])
        pause = threading.Event()
        try:
            bl.wait_until(lambda: probe(port, "/readyz", 2) < 2, 20, what="the health port",
                          proc=proc)
            with SlowClients(port, slow) as clients:
                # a server that cannot take them all never lets all connect: 5 s at most
                clients.all_connected.wait(5.0)
                took: dict[str, list[float]] = {"/livez": [], "/readyz": []}
                t_end = time.monotonic() + budget_s
                for i in range(probes):
                    if time.monotonic() > t_end:
                        break
                    took["/livez" if i % 2 == 0 else "/readyz"].append(
                        probe(port, "/livez" if i % 2 == 0 else "/readyz", timeout))
                    pause.wait(gap_s)
                reopened = clients.reopened
        finally:
            proc.stop()
    out: dict[str, Any] = {"slow": slow, "reopened": reopened}
    for path, values in took.items():
        ms = [v * 1000 for v in values]
        out[path] = {"n": len(ms), "p50_ms": bl.pct(ms, 50), "p99_ms": bl.pct(ms, 99),
                     "max_ms": max(ms, default=float("nan")),
                     "over_1s": sum(1 for v in values if v > 1.0),
                     "unanswered": sum(1 for v in values if v >= timeout)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--slow", default="200", help="slow clients per run, comma-separated")
    ap.add_argument("--probes", type=int, default=200, help="probes per run, /livez and "
                    "/readyz in turn")
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=10.0, help="a probe's own timeout (s)")
    ap.add_argument("--budget", type=float, default=120.0, help="most seconds of probes a run")
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    runs = [measure(int(n), args.probes, args.gap_ms / 1000, args.timeout, args.budget)
            for n in args.slow.split(",")]
    rows = [[r["slow"], path, r[path]["n"], f"{r[path]['p50_ms']:.2f}",
             f"{r[path]['p99_ms']:.2f}", f"{r[path]['max_ms']:.2f}", r[path]["over_1s"],
             r[path]["unanswered"], r["reopened"]]
            for r in runs for path in ("/livez", "/readyz")]
    bl.print_table("Health probes under slow clients (ms)",
                   ["slow clients", "path", "probes", "p50", "p99", "max", "> 1 s",
                    "unanswered", "slow reopened"], rows)
    bl.emit_json(args.json, {"bench": "health_slow_clients", "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
