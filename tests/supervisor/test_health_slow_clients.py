"""The health port under slow clients: half-sent requests, silent connections and clients
that never read their answer cost no thread each and never hold up /livez or /readyz."""

from __future__ import annotations

import os
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from echomq.supervisor.drills.localredis import LocalRedis, free_port
from echomq.supervisor.health import MAX_CONNECTIONS, Health

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]

# far below the 5 s a probe waited behind slow clients, generous for a loaded 2-core machine
PROBE_BOUND_S = 1.5


def _probe(port: int, path: str, timeout: float = 15.0) -> tuple[int, float]:
    """One request as a kubelet sends it: (status, seconds); status 0 when it got none."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            resp.read()
            code = resp.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except OSError:
        code = 0
    return code, time.monotonic() - t0


def _open(port: int, count: int, first: bytes, *, rcvbuf: int = 0) -> list[socket.socket]:
    """``count`` connections that send ``first`` (perhaps nothing) and then nothing more.

    Connects without blocking (a server that does not accept must not stall the test) and
    waits, up to a deadline, for the connects that complete."""
    socks = []
    sel = selectors.DefaultSelector()
    for _ in range(count):
        s = socket.socket()
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE)
    deadline = time.monotonic() + 3.0
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
            sel.unregister(key.fileobj)
            s = key.fileobj  # type: ignore[assignment]
            if first and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                try:
                    s.send(first)
                except OSError:
                    pass
    sel.close()
    return socks


HALF_SENT = b"GET /livez HTTP/1.1\r\nHost: probe\r\n"  # never the blank line
NEVER_READ = b"GET /metrics HTTP/1.0\r\n\r\n"


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_probes_answer_at_once_while_slow_clients_hold_the_health_port(
        supervisor: Start, redis_url: str, queue_name: str,
        clients: list[socket.socket]) -> None:
    port = free_port()
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--health-port", str(port))
    sup.started(1)
    wait_until(lambda: _probe(port, "/readyz", 5)[0] == 200, 15, "ready")
    threads_before = _threads(sup.proc.pid)
    clients += _open(port, 200, HALF_SENT)
    clients += _open(port, 200, b"")
    clients += _open(port, 20, NEVER_READ, rcvbuf=1024)
    for path in ("/livez", "/readyz") * 5:
        code, took = _probe(port, path)
        assert code == 200 and took < PROBE_BOUND_S, (path, code, took)
    # the slow clients are served (or dropped) by the same thread: two workers at most more
    assert _threads(sup.proc.pid) <= threads_before + 2, (threads_before, sup.proc.pid)
    assert sup.proc.poll() is None


def _health(redis_url: str, **kw: object) -> Health:
    snap = {"last_loop": time.monotonic(), "stopping": False, "queues": {}}
    return Health("127.0.0.1", free_port(), redis_url, lambda: snap, 10.0, **kw)  # type: ignore[arg-type]


def _health_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("echomq-health")]


FLOODER = """
import socket, sys
from collections import deque
held = deque()
while True:  # silent connections, as fast as they open, 400 held at most
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5))
    except OSError:
        continue
    if len(held) == 300:
        print("flooding", flush=True)
    while len(held) > 400:
        held.popleft().close()
"""


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_flood_beyond_the_cap_still_lets_every_probe_through(
        supervisor: Start, redis_url: str, queue_name: str) -> None:
    port = free_port()
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--health-port", str(port))
    sup.started(1)
    wait_until(lambda: _probe(port, "/readyz", 5)[0] == 200, 15, "ready")
    pid = sup.proc.pid
    threads, fds = _threads(pid), _fds(pid)
    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(port)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert flooder.stdout is not None
        ready, _, _ = select.select([flooder.stdout], [], [], 15)
        assert ready and flooder.stdout.readline().strip() == "flooding"
        for path in ("/livez", "/readyz") * 10:
            code, took = _probe(port, path)
            assert code == 200 and took < PROBE_BOUND_S, (path, code, took)
            assert _fds(pid) <= fds + MAX_CONNECTIONS + 4, (fds, _fds(pid))
        assert _threads(pid) <= threads + 2, (threads, _threads(pid))
    finally:
        flooder.kill()
        flooder.wait(10)
        flooder.stdout.close()  # type: ignore[union-attr]


def test_the_cap_drops_the_oldest_connection_and_stop_leaves_nothing_open(
        redis_url: str) -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    health = _health(redis_url, request_timeout_s=30.0, max_connections=8)
    health.start()
    threads = len(_health_threads())
    held = [socket.create_connection(("127.0.0.1", health.port), timeout=5) for _ in range(8)]
    try:
        wait_until(lambda: health.open_connections() == 8, 5, "eight connections")
        held.append(socket.create_connection(("127.0.0.1", health.port), timeout=5))
        assert held[0].recv(1) == b""  # the oldest, closed for the newcomer
        wait_until(lambda: health.open_connections() == 8, 5, "the newcomer in its place")
        assert _probe(health.port, "/readyz")[0] == 200  # a probe takes the next oldest's
        assert held[1].recv(1) == b""
        for s in held[2:]:  # the newer ones stay
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
        assert health.most_connections <= 8
        assert len(_health_threads()) == threads
    finally:
        for s in held:
            s.close()
        health.stop()
    assert not _health_threads()
    wait_until(lambda: len(os.listdir("/proc/self/fd")) <= fds_before, 5,
               "every socket of the server closed")


def test_a_client_that_dribbles_its_request_is_dropped_at_its_deadline(redis_url: str) -> None:
    health = _health(redis_url, request_timeout_s=0.5)
    health.start()
    try:
        s = socket.create_connection(("127.0.0.1", health.port))
        t0 = time.monotonic()
        s.sendall(b"GET /livez HTTP/1.0\r\nX-Slow: ")
        s.settimeout(0.1)  # one byte each 0.1 s, until the server hangs up
        closed = False
        while time.monotonic() - t0 < 5 and not closed:
            try:
                closed = s.recv(1024) == b""
            except TimeoutError:
                try:
                    s.send(b"a")
                except OSError:
                    closed = True
            except OSError:
                closed = True
        took = time.monotonic() - t0
        s.close()
        assert closed and 0.4 < took < 2.0, (closed, took)
        wait_until(lambda: health.open_connections() == 0, 5, "the connection dropped")
    finally:
        health.stop()


def test_oversize_headers_get_431(redis_url: str) -> None:
    health = _health(redis_url)
    health.start()
    try:
        s = socket.create_connection(("127.0.0.1", health.port), timeout=5)
        head = b"GET /livez HTTP/1.0\r\n" + b"".join(
            f"X-Pad-{i}: {'a' * 1000}\r\n".encode() for i in range(60))
        try:
            s.sendall(head + b"\r\n")
        except OSError:
            pass  # closed while we sent: also refused
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except OSError:
            pass
        s.close()
        assert answer.startswith(b"HTTP/1.0 431 "), answer[:100]
    finally:
        health.stop()


def test_livez_answers_while_readyz_waits_on_a_hung_valkey(
        private_redis: LocalRedis) -> None:
    health = _health(private_redis.url)
    health.start()
    waiting: list[socket.socket] = []
    try:
        assert _probe(health.port, "/readyz")[0] == 200
        private_redis.pause()
        try:
            waiting += _open(health.port, 10, b"GET /readyz HTTP/1.0\r\n\r\n")
            waiting += _open(health.port, 10, b"GET /metrics HTTP/1.0\r\n\r\n")
            for _ in range(5):
                code, took = _probe(health.port, "/livez")
                assert code == 200 and took < PROBE_BOUND_S, (code, took)
        finally:
            private_redis.resume()
        code, took = _probe(health.port, "/readyz")
        assert code == 200, code
    finally:
        for s in waiting:
            s.close()
        health.stop()


def test_a_forked_child_keeps_none_of_the_servers_sockets(redis_url: str) -> None:
    health = _health(redis_url)
    health.start()
    port = health.port
    held = socket.create_connection(("127.0.0.1", port))
    held.sendall(b"GET /livez HTTP/1.0\r\n")  # open in the server when the child forks
    wait_until(lambda: health.open_connections() == 1, 5, "the open connection")
    go_on, child_waits = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: forget, say so, then stay alive until told
        try:
            health.forget_in_child()
            child_waits.send(b"f")
            child_waits.recv(1)
        finally:
            os._exit(0)
    try:
        go_on.settimeout(10)
        assert go_on.recv(1) == b"f"
        assert _probe(port, "/livez")[0] == 200  # the parent serves on
        health.stop()
        held.settimeout(5)
        assert held.recv(1024) == b""  # stop closed it
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        go_on.send(b"x")
        os.waitpid(pid, 0)
        held.close()
        go_on.close()
        child_waits.close()


OUT_OF_FDS = """
import logging, os, resource, sys, threading, time
from echomq.supervisor.httpd import Server

failures = []
first = threading.Event()

class Count(logging.Handler):
    def emit(self, record):
        if "accept failed" in record.getMessage():
            failures.append(record)
            first.set()

logging.getLogger("echomq.supervisor.health").addHandler(Count())
logging.getLogger("echomq.supervisor.health").propagate = False
answer = (200, "text/plain", b"ok\\n", {})
server = Server("127.0.0.1", 0, lambda request: answer, lambda request: answer,
                timeout_s=30.0, max_connections=8)
server.start()
stat = os.open(f"/proc/self/task/{server.thread.native_id}/stat", os.O_RDONLY)
ticks = os.sysconf("SC_CLK_TCK")

def cpu_s():  # the server thread's CPU time
    fields = os.pread(stat, 4096, 0).decode().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / ticks

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
filler = []
while True:  # every fd taken: the server holds no connection it could close for one
    try:
        filler.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
print(server.port, flush=True)
assert first.wait(30), "no accept failed"
before = cpu_s()
threading.Event().wait(1.0)  # what the loop does in a second of wall time
spent, logged = cpu_s() - before, len(failures)
for fd in filler:
    os.close(fd)
print(spent, logged, flush=True)
sys.stdin.readline()
server.stop()
"""


def test_accept_out_of_fds_with_nothing_to_close_does_not_spin() -> None:
    proc = subprocess.Popen([sys.executable, "-c", OUT_OF_FDS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        port = int(proc.stdout.readline())
        client = socket.create_connection(("127.0.0.1", port), timeout=10)  # in the backlog
        client.sendall(b"GET /livez HTTP/1.0\r\n\r\n")
        spent, logged = proc.stdout.readline().split()
        # a loop that tried again at once took a core and logged ~40,000 lines a second
        assert float(spent) < 0.25 and int(logged) <= 5, (spent, logged)
        # fds free again: the connection waiting in the backlog is accepted and answered
        assert client.recv(1024).startswith(b"HTTP/1.0 200"), "no answer"
        client.close()
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(30) == 0
