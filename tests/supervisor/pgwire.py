"""A TCP relay in front of a real PostgreSQL server that counts the client's round trips.

Each connection is relayed by two threads. The client's side is parsed as PostgreSQL's
frontend protocol: the untyped startup messages (an SSL or GSS request, then the
startup packet), then typed messages (a type byte and a length). A simple query (``Q``)
and the end of an extended-protocol exchange (``S``, Sync) each wait for the server's
answer: :attr:`PgWire.round_trips` counts them, over every connection. Use as a context
manager; :attr:`PgWire.port` is where clients connect.
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

SSL_REQUEST = 80877103
GSS_REQUEST = 80877104
WAITS = (b"Q", b"S")


class PgWire:
    """Relays connections to ``target_port`` and counts each one's round trips."""

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self._listen = socket.create_server((host, 0))
        self.port = self._listen.getsockname()[1]
        self._lock = threading.Lock()
        self.round_trips = 0
        self.statements: list[bytes] = []  # the text of each simple query, in order
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> PgWire:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._listen.close()
        for s in list(self._socks):
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listen.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._socks += [client, server]
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        while data := _recv(server):
            try:
                client.sendall(data)
            except OSError:
                break
        _shut(client)

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        buf = bytearray()
        started = False
        while data := _recv(client):
            buf += data
            while True:
                if not started:
                    if len(buf) < 8:
                        break
                    length, code = struct.unpack("!II", buf[:8])
                    if len(buf) < length:
                        break
                    started = code not in (SSL_REQUEST, GSS_REQUEST)
                else:
                    if len(buf) < 5:
                        break
                    length = struct.unpack("!I", buf[1:5])[0] + 1
                    if len(buf) < length:
                        break
                    kind = bytes(buf[:1])
                    if kind in WAITS:
                        with self._lock:
                            self.round_trips += 1
                            if kind == b"Q":
                                self.statements.append(bytes(buf[5:length - 1]))
                try:
                    server.sendall(bytes(buf[:length]))
                except OSError:
                    return
                del buf[:length]
        _shut(server)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
