"""A TCP proxy between clients and a real server that cuts one connection at a chosen
command, for tests of what a client does when its own connection fails.

Every accepted connection is relayed to the server by two threads. Requests are parsed
(RESP arrays, or inline commands) and relayed whole, one command at a time, so a cut
lands between two commands: commands written together (a pipeline) before the chosen
one reach the server, the chosen one and those after it reach it only in ``"after"``
mode. A cut is armed with :meth:`Proxy.cut` and fires once, at the ``nth`` command any
connection sends that its predicate matches (counted from when it was armed):

- ``"before"``: the command is not relayed; both sides of its connection are closed
  (a request that never reached the server: a settle never sent);
- ``"after"``: the command is relayed, then the client's side is closed and nothing
  more is relayed to it, while the server's side stays open until :meth:`Proxy.close`,
  so the server runs it (a reply lost on the way back: a claim that ran unseen).

Other connections, and new ones made after the cut, are relayed untouched. Predicates
get the command as a list of bytes; :func:`script` and :func:`command` build common
ones. Use as a context manager, or call :meth:`Proxy.close`.

    with Proxy(server_port) as proxy:
        cut = proxy.cut(script(scripts.CLAIM), when="after")
        ...  # clients connect to proxy.url
        assert cut.fired.wait(10)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

Command = list[bytes]
Predicate = Callable[[Command], bool]


def script(lua: object) -> Predicate:
    """Matches a call of an :class:`echomq.scripts.LuaScript` (EVALSHA by its SHA1, or
    EVAL of its source)."""
    sha = str(lua.sha).encode()  # type: ignore[attr-defined]
    source = str(lua.source).encode()  # type: ignore[attr-defined]

    def match(cmd: Command) -> bool:
        name = cmd[0].upper() if cmd else b""
        return (name == b"EVALSHA" and len(cmd) > 1 and cmd[1].lower() == sha) or \
            (name == b"EVAL" and len(cmd) > 1 and cmd[1] == source)

    return match


def command(name: str) -> Predicate:
    """Matches every command of this name (any case)."""
    wanted = name.upper().encode()
    return lambda cmd: bool(cmd) and cmd[0].upper() == wanted


@dataclass
class Cut:
    """One armed cut: fires once, at the ``nth`` matching command."""

    match: Predicate
    nth: int
    when: str
    seen: int = 0
    fired: threading.Event = field(default_factory=threading.Event)
    command: Command | None = None  # the command it fired at


def parse_command(buf: bytes | bytearray, start: int) -> tuple[Command, int] | None:
    """The command at ``buf[start:]`` and the offset past it, or None while incomplete."""
    if start >= len(buf):
        return None
    if buf[start:start + 1] != b"*":  # an inline command: one line of words
        end = buf.find(b"\r\n", start)
        if end < 0:
            return None
        return bytes(buf[start:end]).split(), end + 2
    end = buf.find(b"\r\n", start)
    if end < 0:
        return None
    count = int(buf[start + 1:end])
    pos, args = end + 2, []
    for _ in range(count):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        size = int(buf[pos + 1:end])  # "$<size>"
        if len(buf) < end + 2 + size + 2:
            return None
        args.append(bytes(buf[end + 2:end + 2 + size]))
        pos = end + 2 + size + 2
    return args, pos


class Proxy:
    """Relays 127.0.0.1:<port> to the server at ``host``:``target_port``."""

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.cuts: list[Cut] = []
        self.socks: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        """A redis:// URL through this proxy (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def cut(self, match: Predicate, *, nth: int = 1, when: str = "before") -> Cut:
        """Arm a cut of the connection that sends the ``nth`` command matching ``match``
        from now on; ``when`` is "before" or "after" (see the module's docstring)."""
        if when not in ("before", "after") or nth < 1:
            raise ValueError(f"bad cut: when={when!r}, nth={nth}")
        armed = Cut(match, nth, when)
        with self.lock:
            self.cuts.append(armed)
        return armed

    def sever_all(self) -> None:
        """Close every connection relayed so far, both sides (new ones are relayed)."""
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            _close(s)

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self.closed = True
        _close(self.listener)
        self.sever_all()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- relaying ------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            with self.lock:
                if self.closed:
                    _close(client)
                    _close(server)
                    return
                self.socks += [client, server]
            muted = threading.Event()  # nothing more goes to the client
            threading.Thread(target=self._up, args=(client, server, muted), daemon=True,
                             name="proxy-up").start()
            threading.Thread(target=self._down, args=(server, client, muted), daemon=True,
                             name="proxy-down").start()

    def _firing(self, cmd: Command) -> Cut | None:
        """The cut this command fires, if any (counting it for every armed cut)."""
        with self.lock:
            for armed in self.cuts:
                if armed.fired.is_set() or not armed.match(cmd):
                    continue
                armed.seen += 1
                if armed.seen == armed.nth:
                    armed.command = cmd
                    return armed
        return None

    def _up(self, client: socket.socket, server: socket.socket,
            muted: threading.Event) -> None:
        buf = bytearray()
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(server)
                return
            buf += data
            pos = 0
            while (parsed := parse_command(buf, pos)) is not None:
                cmd, end = parsed
                armed = self._firing(cmd)
                if armed is None:
                    pos = end
                    continue
                if armed.when == "after":
                    muted.set()  # before it goes: its reply is never relayed
                    pos = end
                _send(server, bytes(buf[:pos]))
                _close(client)
                if armed.when == "before":
                    _close(server)
                armed.fired.set()
                return
            if pos:
                if not _send(server, bytes(buf[:pos])):
                    _close(client)
                    return
                del buf[:pos]

    def _down(self, server: socket.socket, client: socket.socket,
              muted: threading.Event) -> None:
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(client)
                return
            if muted.is_set() or not _send(client, data):
                continue  # drained and dropped: the server's side stays open


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
