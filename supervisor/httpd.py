"""A small HTTP/1.0 server on one thread: a selector reads every connection's request
without a thread each, so slow or silent clients cost a socket and a few bytes, never a
thread, and never hold up a probe behind them.

Each connection has one deadline, ``timeout_s`` after its accept, for its whole request
and answer. At ``max_connections`` a new connection drops the oldest one still sending
its request, so a flood cannot keep a new probe out. A request is first offered to
``quick``, which runs on the loop and must not block (it returns None to pass); anything
else runs on a few worker threads, whose answers come back through a wake-up socket, so
the loop never waits on them. One request per connection; the answer closes it.
"""

from __future__ import annotations

import collections
import email.utils
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from echomq.supervisor.signals import sever

log = logging.getLogger("echomq.supervisor.health")

MAX_HEAD_BYTES = 16 * 1024  # request line and headers; more is answered 431
MAX_BODY_BYTES = 64 * 1024  # a POST body is cut here (the dashboard's forms are small)
WORKERS = 2  # threads for the answers that talk to Valkey
WORK_QUEUE = 32  # requests waiting for a worker; more are answered 503 at once
STOP_JOIN_S = 6.0  # a worker may be inside one Valkey call (socket timeouts <= 5 s)
ACCEPT_PAUSE_S = 0.1  # out of fds with no connection to close: the listener rests this long

Response = tuple[int, str, bytes, dict[str, str]]


@dataclass(frozen=True)
class Request:
    """One parsed request; header names in lower case."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?")[0]


class BadRequest(ValueError):
    """The request cannot be parsed: answered with ``code`` and closed."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


def parse_head(head: bytes) -> Request:
    """The request line and headers (without the blank line) as a body-less Request."""
    lines = head.decode("iso-8859-1").replace("\r\n", "\n").split("\n")
    words = lines[0].split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        raise BadRequest(400, "bad request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon and name.strip():
            headers.setdefault(name.strip().lower(), value.strip())
    return Request(words[0], words[1], headers)


def body_length(request: Request) -> int:
    """How many body bytes to read: a POST's Content-Length, cut at MAX_BODY_BYTES."""
    if request.method != "POST":
        return 0
    try:
        length = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise BadRequest(400, "bad content-length") from None
    if length < 0:
        raise BadRequest(400, "bad content-length")
    return min(length, MAX_BODY_BYTES)


def render(response: Response) -> bytes:
    """The bytes of an HTTP/1.0 answer."""
    code, ctype, body, extra = response
    try:
        phrase = HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.0 {code} {phrase}", f"Date: {email.utils.formatdate(usegmt=True)}",
             f"Content-Type: {ctype}", f"Content-Length: {len(body)}",
             *(f"{k}: {v}" for k, v in extra.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body


def _text(code: int, text: str) -> Response:
    return code, "text/plain", f"{text}\n".encode(), {}


@dataclass(eq=False)
class Connection:
    """One client: what it sent so far, and what is left to write back."""

    sock: socket.socket
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    request: Request | None = None  # the head, once complete; the body may still come
    want_body: int = 0
    state: str = "read"  # read -> work (a worker has it) -> write
    outbox: memoryview = memoryview(b"")
    closed: bool = False


class Workers:
    """A few threads running the answers that may block, from a bounded queue."""

    def __init__(self, count: int, size: int) -> None:
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(size)
        self.threads = [threading.Thread(target=self._run, name=f"echomq-health-worker-{i}",
                                         daemon=True) for i in range(count)]

    def start(self) -> None:
        """Start the threads."""
        for t in self.threads:
            t.start()

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue ``job``; False when the queue is full."""
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            return False
        return True

    def stop(self, deadline: float) -> None:
        """Let each thread finish its job and end, waiting until ``deadline`` at most."""
        for t in self.threads:
            if t.is_alive():
                try:  # the queued jobs of closed connections return at once
                    self.jobs.put(None, timeout=max(0.0, deadline - time.monotonic()))
                except queue.Full:
                    return
        for t in self.threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()


class Server:
    """The listener, its connections and the loop that serves them (see the module)."""

    def __init__(self, host: str, port: int, quick: Callable[[Request], Response | None],
                 slow: Callable[[Request], Response], *, timeout_s: float,
                 max_connections: int, workers: int = WORKERS) -> None:
        self.quick, self.slow = quick, slow
        self.timeout_s = timeout_s
        self.max_connections = max(1, max_connections)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, backlog=128)
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])  # kept: readable after stop
        self.waker, self.wake_writer = socket.socketpair()
        self.waker.setblocking(False)
        self.wake_writer.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.waker, selectors.EVENT_READ)
        self.conns: dict[Connection, None] = {}  # in accept order, so in deadline order too
        self.most = 0
        self.answers: collections.deque[tuple[Connection, Response]] = collections.deque()
        self.workers = Workers(workers, WORK_QUEUE)
        self.thread = threading.Thread(target=self._serve, name="echomq-health", daemon=True)
        self.stopping = False
        self.closed = False
        self.accept_resume: float | None = None  # when a listener resting (out of fds) is back
        self.accept_failing = False  # logged once until an accept succeeds again

    def start(self) -> None:
        """Serve on a background thread."""
        self.workers.start()
        self.thread.start()

    def stop(self) -> None:
        """Stop serving; close the listener and every connection; end the threads."""
        deadline = time.monotonic() + STOP_JOIN_S
        self.stopping = True
        if self.thread.is_alive():
            self._wake()
            self.thread.join(max(0.0, deadline - time.monotonic()))
        else:
            self._close_all()
        self.workers.stop(deadline)

    def forget_in_child(self) -> None:
        """In a forked child: drop every inherited socket without shutting it down (that
        would end it for the parent too); the threads do not exist here."""
        for conn in list(self.conns):
            sever(conn.sock)
        for sock in (self.listener, self.waker, self.wake_writer):
            sever(sock)
        self.selector.close()  # epoll's fd only: the parent's registrations stay

    # --- the loop -------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self.stopping:
                timeout = None
                if self.conns:
                    timeout = max(0.0, next(iter(self.conns)).deadline - time.monotonic())
                if self.accept_resume is not None:
                    rest = max(0.0, self.accept_resume - time.monotonic())
                    timeout = rest if timeout is None else min(timeout, rest)
                accept = False
                for key, mask in self.selector.select(timeout):
                    if key.fileobj is self.listener:
                        accept = True  # after the reads: a probe's request is read first
                    elif key.fileobj is self.waker:
                        self._take_answers()
                    elif key.data.closed:
                        continue
                    elif mask & selectors.EVENT_READ:
                        self._read(key.data)
                    else:
                        self._write(key.data)
                if accept:
                    self._accept()
                elif self.accept_resume is not None and time.monotonic() >= self.accept_resume:
                    self.accept_resume = None
                    self.selector.register(self.listener, selectors.EVENT_READ)
                self._expire(time.monotonic())
        except Exception:  # the port must not die silently
            log.exception("health server failed")
        finally:
            self._close_all()

    def _accept(self) -> None:
        # at most half the cap a turn, so a probe accepted last turn is read before the
        # connections behind it could push it out
        for _ in range(max(1, self.max_connections // 2)):
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of fds: drop the oldest, try again next turn
                if not self.accept_failing:
                    self.accept_failing = True
                    log.warning("health port: accept failed: %s", exc)
                if self.conns:
                    self._drop(self._oldest_reading())
                else:  # nothing of ours to close: rest the listener, or the loop would spin
                    self.selector.unregister(self.listener)
                    self.accept_resume = time.monotonic() + ACCEPT_PAUSE_S
                return
            self.accept_failing = False
            if len(self.conns) >= self.max_connections:
                self._drop(self._oldest_reading())
            sock.setblocking(False)
            conn = Connection(sock, time.monotonic() + self.timeout_s)
            self.conns[conn] = None
            self.most = max(self.most, len(self.conns))
            self.selector.register(sock, selectors.EVENT_READ, conn)
            self._read(conn)  # a probe's request is often here already: answered before more come

    def _oldest_reading(self) -> Connection:
        for conn in self.conns:
            if conn.state == "read":
                return conn
        return next(iter(self.conns))

    def _expire(self, now: float) -> None:
        while self.conns:
            first = next(iter(self.conns))
            if first.deadline > now:
                return
            self._drop(first)

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(8192)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.inbox += data
        try:
            request = self._parse(conn)
        except BadRequest as exc:
            self._answer(conn, _text(exc.code, str(exc)))
            return
        if request is not None:
            self._dispatch(conn, request)

    def _parse(self, conn: Connection) -> Request | None:
        """The whole request once it has arrived, else None (keep reading)."""
        if conn.request is None:
            end, gap = conn.inbox.find(b"\r\n\r\n"), 4
            if end < 0:
                end, gap = conn.inbox.find(b"\n\n"), 2
            if end < 0 or end > MAX_HEAD_BYTES:
                if len(conn.inbox) > MAX_HEAD_BYTES:
                    raise BadRequest(431, "request header fields too large")
                return None
            conn.request = parse_head(bytes(conn.inbox[:end]))
            conn.want_body = body_length(conn.request)
            del conn.inbox[:end + gap]
        if len(conn.inbox) < conn.want_body:
            return None
        body = bytes(conn.inbox[:conn.want_body])
        r = conn.request
        return Request(r.method, r.target, r.headers, body)

    def _dispatch(self, conn: Connection, request: Request) -> None:
        try:
            answer = self.quick(request)
        except Exception:  # one request's failure, not the server's
            log.exception("health port: %s %s failed", request.method, request.path)
            answer = _text(500, "internal error")
        if answer is not None:
            self._answer(conn, answer)
            return
        conn.state = "work"
        self.selector.unregister(conn.sock)

        def job() -> None:
            if conn.closed:
                return  # dropped while it waited: no work for nobody
            try:
                result = self.slow(request)
            except Exception:  # one request's failure, not the server's
                log.exception("health port: %s %s failed", request.method, request.path)
                result = _text(500, "internal error")
            self.answers.append((conn, result))
            self._wake()

        if not self.workers.submit(job):
            self._answer(conn, _text(503, "busy"))

    def _wake(self) -> None:
        try:
            self.wake_writer.send(b"x")
        except (BlockingIOError, OSError):
            pass  # full: the loop wakes anyway; closed: stopping

    def _take_answers(self) -> None:
        try:
            while self.waker.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self.answers:
            conn, response = self.answers.popleft()
            if not conn.closed:
                self._answer(conn, response)

    def _answer(self, conn: Connection, response: Response) -> None:
        conn.outbox = memoryview(render(response))
        if conn.state == "work":  # unregistered while a worker had it
            self.selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        else:
            self.selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        conn.state = "write"
        self._write(conn)

    def _write(self, conn: Connection) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self._drop(conn, finished=True)

    def _drop(self, conn: Connection, *, finished: bool = False) -> None:
        """Close one connection: after its answer, shut down the sending side (as
        http.server does); otherwise both, so a client waiting on it sees the end."""
        conn.closed = True
        self.conns.pop(conn, None)
        if conn.state != "work":
            try:
                self.selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        try:
            conn.sock.shutdown(socket.SHUT_WR if finished else socket.SHUT_RDWR)
        except OSError:
            pass
        conn.sock.close()

    def _close_all(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in list(self.conns):
            self._drop(conn)
        self.selector.close()
        for sock in (self.listener, self.waker, self.wake_writer):
            sock.close()
