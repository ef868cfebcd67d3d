"""A TCP proxy between clients and a real server that cuts one connection at a chosen
command, for tests of what a client does when its own connection fails.

Every accepted connection is relayed to the server by two threads. Requests are parsed
(RESP arrays, or inline commands) and relayed whole, one command at a time, and so are
replies (RESP2 or RESP3), counted, so a cut lands exactly between two commands: the
client gets the replies of the commands it sent before the chosen one (in the same
pipeline too), then its connection is closed. A cut is armed with :meth:`Proxy.cut` and
fires once, at the ``nth`` command any connection sends that its predicate matches
(counted from when it was armed):

- ``"before"``: the command is not relayed; the server's side is closed too (a request
  that never reached the server: a settle never sent);
- ``"after"``: the command is relayed, and the server's side stays open until
  :meth:`Proxy.close`, so the server runs it, its reply dropped (a reply lost on the
  way back: a claim that ran unseen);
- ``"after"`` with ``reply=``: the same, judged on the reply instead, for what a
  command did that only its reply tells (the claim that leased a given job).

Commands written after the chosen one are never relayed. Other connections, and new
ones made after the cut, are relayed untouched. :meth:`Proxy.hold` holds commands back
instead, each connection at the first one it sends that matches, until the test lets
them go (in the order they were held): a request still on its way to the server when
its client died, which the server runs later. Predicates get the command as a list of
bytes; :func:`script` and :func:`command` build common ones; ``on=`` narrows a cut (or
a hold) to the connections a predicate on the :class:`Link` accepts. :meth:`Proxy.watch`
counts commands without cutting; an ``observer`` (see :class:`Observer`) sees every
command, every reply the server sent (those a cut dropped too) and every cut, with its
connection (what it raises is kept in ``Proxy.errors``); :meth:`Proxy.sever_all` cuts
every connection at once. Use as a context manager, or call :meth:`Proxy.close`.

    with Proxy(server_port) as proxy:
        cut = proxy.cut(script(scripts.CLAIM), when="after")
        ...  # clients connect to proxy.url
        assert cut.fired.wait(10)
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

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


class Observer(Protocol):
    """Sees a proxy's traffic, on the relaying threads (keep it quick)."""

    def command(self, link: Link, cmd: Command) -> None:
        """``cmd`` arrived from the client (before any cut judges it)."""

    def reply(self, link: Link, cmd: Command, reply: bytes, dropped: bool) -> None:
        """The server answered ``cmd``; ``dropped`` when a cut kept it from the client."""

    def cut(self, link: Link, armed: Cut) -> None:
        """``armed`` fired on ``link`` (before its client's side is closed)."""


@dataclass
class Cut:
    """One armed cut: fires once, at the ``nth`` matching command."""

    match: Predicate
    nth: int
    when: str
    reply: Callable[[bytes], bool] | None = None  # judged on the reply instead
    on: Callable[[Link], bool] | None = None  # only commands of the links it accepts
    seen: int = 0
    fired: threading.Event = field(default_factory=threading.Event)
    command: Command | None = None  # the command it fired at


class Watch:
    """Counts the commands any connection sends that match a predicate (counted from when
    it was made, cut ones included)."""

    def __init__(self, match: Predicate) -> None:
        self.match = match
        self.count = 0
        self.cond = threading.Condition()

    def saw(self, cmd: Command) -> None:
        if self.match(cmd):
            with self.cond:
                self.count += 1
                self.cond.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        """True once ``count`` matching commands were seen; False at the timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: self.count >= count, timeout)


class Hold:
    """Holds back each connection at the first command matching a predicate (that command
    and what the connection sends after it), from when it was made until let go. A
    connection let go is relayed again; its server side then stays open when its client
    leaves (until :meth:`Proxy.close`), so the server runs what was held, and the reply
    is counted as answered."""

    def __init__(self, match: Predicate, on: Callable[[Link], bool] | None) -> None:
        self.match, self.on = match, on
        self.cond = threading.Condition()
        self.held: list[tuple[Link, Command, threading.Event]] = []
        self.answers = 0  # replies to let-go commands the server sent
        self.done = False  # let go entirely: holds nothing more

    def wait_held(self, count: int, timeout: float) -> bool:
        """True once ``count`` connections are held (or were); False at the timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: len(self.held) >= count, timeout)

    def let_go(self, count: int | None = None) -> None:
        """Relay the first ``count`` connections held (all, and hold nothing more, when
        None)."""
        with self.cond:
            if count is None:
                self.done = True
            for _, _, gate in self.held[:count]:
                gate.set()

    def wait_answered(self, count: int, timeout: float) -> bool:
        """True once the server answered ``count`` of the commands let go."""
        with self.cond:
            return self.cond.wait_for(lambda: self.answers >= count, timeout)

    def gate(self, link: Link, cmd: Command) -> threading.Event | None:
        """The event ``cmd`` must wait for before it is relayed, None to relay it now."""
        with self.cond:
            if self.done or any(held is link for held, _, _ in self.held) or \
                    not self.match(cmd) or (self.on is not None and not self.on(link)):
                return None
            gate = threading.Event()
            self.held.append((link, cmd, gate))
            self.cond.notify_all()
            return gate

    def answered(self, cmd: Command) -> None:
        with self.cond:
            if any(held is cmd for _, held, gate in self.held if gate.is_set()):
                self.answers += 1
                self.cond.notify_all()


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

    def __init__(self, target_port: int, host: str = "127.0.0.1",
                 observer: Observer | None = None) -> None:
        self.target = (host, target_port)
        self.observer = observer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.cuts: list[Cut] = []
        self.watches: list[Watch] = []
        self.holds: list[Hold] = []
        self.socks: list[socket.socket] = []
        self.errors: list[str] = []  # what the observer raised (see _observe)
        self.closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        """A redis:// URL through this proxy (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def cut(self, match: Predicate, *, nth: int = 1, when: str = "before",
            reply: Callable[[bytes], bool] | None = None,
            on: Callable[[Link], bool] | None = None) -> Cut:
        """Arm a cut of the connection that sends the ``nth`` command matching ``match``
        from now on; ``when`` is "before" or "after" (see the module's docstring). With
        ``reply``, the cut is "after" the ``nth`` command matching ``match`` whose reply
        (its raw bytes) ``reply`` accepts: that reply is dropped, the client's side closed
        (what a command took is known only once it ran: a claim that leased a given job).
        With ``on``, only the commands of the connections it accepts count."""
        if when not in ("before", "after") or nth < 1 or (reply and when != "after"):
            raise ValueError(f"bad cut: when={when!r}, nth={nth}, reply={reply!r}")
        armed = Cut(match, nth, when, reply, on)
        with self.lock:
            self.cuts.append(armed)
        return armed

    def watch(self, match: Predicate) -> Watch:
        """Count the commands matching ``match`` from now on (see :class:`Watch`)."""
        watch = Watch(match)
        with self.lock:
            self.watches.append(watch)
        return watch

    def hold(self, match: Predicate, *,
             on: Callable[[Link], bool] | None = None) -> Hold:
        """Hold back, from now on, each connection at the first command matching ``match``
        (with ``on``: of the connections it accepts) until the test lets it go (see
        :class:`Hold`)."""
        held = Hold(match, on)
        with self.lock:
            self.holds.append(held)
        return held

    def sever_all(self) -> None:
        """Close every connection relayed so far, both sides (new ones are relayed)."""
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            _close(s)

    def close(self) -> None:
        """Stop accepting and close every connection (what is held is let go first)."""
        self.closed = True
        with self.lock:
            holds = list(self.holds)
        for held in holds:
            held.let_go()
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
            link = Link(client, server, self)
            threading.Thread(target=self._up, args=(link,), daemon=True,
                             name="proxy-up").start()
            threading.Thread(target=link.down, daemon=True, name="proxy-down").start()

    def _firing(self, cmd: Command, link: Link) -> Cut | None:
        """The cut this command fires, if any; it counts for every armed cut it matches
        (two cuts reaching their nth match at once act as the first armed)."""
        firing = None
        with self.lock:
            for watch in self.watches:
                watch.saw(cmd)
            for armed in self.cuts:
                if armed.command is not None or armed.reply or not armed.match(cmd) or \
                        (armed.on is not None and not armed.on(link)):
                    continue
                armed.seen += 1
                if armed.seen == armed.nth:
                    armed.command = cmd
                    firing = firing or armed
        return firing

    def _fired(self, cmd: Command) -> None:
        with self.lock:
            for armed in self.cuts:
                if armed.command is cmd:
                    armed.fired.set()

    def _reply_firing(self, cmd: Command, reply: bytes, link: Link) -> Cut | None:
        """The cut this reply to ``cmd`` fires, if any (it counts for every cut armed by
        now that judges replies and accepts it, wherever ``cmd`` was relayed before)."""
        firing = None
        with self.lock:
            for armed in self.cuts:
                if armed.command is not None or not armed.reply or not armed.match(cmd) \
                        or not armed.reply(reply) or (armed.on is not None and not armed.on(link)):
                    continue
                armed.seen += 1
                if armed.seen == armed.nth:
                    armed.command = cmd
                    firing = firing or armed
        return firing

    def _observe(self, what: str, *args: object) -> None:
        """Call the observer's ``what``; what it raises is kept in :attr:`errors` (the
        relaying goes on: a relaying thread that died would leave its client waiting for
        a reply that never comes)."""
        if self.observer is None:
            return
        try:
            getattr(self.observer, what)(*args)
        except Exception as exc:  # noqa: BLE001 - kept for the test to report
            with self.lock:
                self.errors.append(f"observer {what}: {type(exc).__name__}: {exc}")

    def _observe_cut(self, link: Link, armed: Cut) -> None:
        self._observe("cut", link, armed)

    def _observe_reply(self, link: Link, cmd: Command, reply: bytes, dropped: bool) -> None:
        with self.lock:
            holds = list(self.holds)
        for held in holds:
            held.answered(cmd)
        self._observe("reply", link, cmd, reply, dropped)

    def _gate(self, cmd: Command, link: Link) -> threading.Event | None:
        with self.lock:
            holds = list(self.holds)
        for held in holds:
            gate = held.gate(link, cmd)
            if gate is not None:
                return gate
        return None

    def _up(self, link: Link) -> None:
        buf = bytearray()
        while True:
            try:
                data = link.client.recv(65536)
            except OSError:
                data = b""
            if not data:
                if not link.let_go:
                    _close(link.server)
                return
            buf += data
            pos = 0
            while (parsed := parse_command(buf, pos)) is not None:
                cmd, end = parsed
                self._observe("command", link, cmd)
                gate = self._gate(cmd, link)
                if gate is not None:  # what came before it goes now; it waits to be let go
                    if pos and not _send(link.server, bytes(buf[:pos])):
                        _close(link.client)
                        return
                    del buf[:pos]
                    end -= pos
                    pos = 0
                    gate.wait()
                    link.let_go = True  # the server runs it after its client is gone
                armed = self._firing(cmd, link)
                if armed is None:
                    pos = end
                    link.expect(cmd)
                    continue
                # the commands before it are answered; the client hears nothing after
                answered = link.sent
                if armed.when == "after":
                    link.expect(cmd)  # its reply, dropped, is still observed
                self._observe_cut(link, armed)
                link.cut_after(answered, keep_server=armed.when == "after")
                _send(link.server, bytes(buf[:end if armed.when == "after" else pos]))
                self._fired(cmd)
                return
            if pos:
                if not _send(link.server, bytes(buf[:pos])):
                    _close(link.client)
                    return
                del buf[:pos]


class Link:
    """One relayed connection. Replies are relayed whole and counted, so a cut closes the
    client's side right after the replies of the commands before the one it fired at."""

    def __init__(self, client: socket.socket, server: socket.socket, proxy: Proxy) -> None:
        self.client = client
        self.server = server
        self.proxy = proxy
        self.lock = threading.Lock()
        self.sent = 0  # commands relayed to the server
        self.expected: deque[Command] = deque()  # relayed, not answered yet
        self.relayed = 0  # replies relayed to the client
        self.limit: int | None = None  # replies the client gets, once a cut fired
        self.keep_server = False
        self.let_go = False  # held back by a Hold and let go: the server side stays open
        self.tag: str | None = None  # for an observer: whose connection this is

    def expect(self, cmd: Command) -> None:
        """``cmd`` is about to be relayed (its reply comes in this order)."""
        with self.lock:
            self.sent += 1
            self.expected.append(cmd)

    def cut_after(self, replies: int, keep_server: bool) -> None:
        """Close the client's side once ``replies`` replies reached it (the server's side
        too, unless ``keep_server``: it then runs what it got, its replies dropped)."""
        with self.lock:
            self.limit, self.keep_server = replies, keep_server
            self._close_if_due()

    def _close_if_due(self) -> None:
        if self.limit is not None and self.relayed >= self.limit:
            _close(self.client)
            if not self.keep_server:
                _close(self.server)

    def down(self) -> None:
        """Relay the server's replies, one whole reply at a time, until the limit."""
        buf = bytearray()
        while True:
            try:
                data = self.server.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(self.client)
                return
            buf += data
            pos = 0
            while (end := reply_end(buf, pos)) is not None:
                reply, pos = bytes(buf[pos:end]), end
                with self.lock:
                    if reply[:1] == b">":  # a push answers no command
                        if self.limit is None or self.relayed < self.limit:
                            _send(self.client, reply)
                        continue
                    cmd = self.expected.popleft() if self.expected else []
                    if self.limit is not None and self.relayed >= self.limit:
                        # dropped: the server's side drains
                        self.proxy._observe_reply(self, cmd, reply, dropped=True)
                        continue
                    armed = self.proxy._reply_firing(cmd, reply, self)
                    if armed is not None:
                        self.limit, self.keep_server = self.relayed, True
                        self.proxy._observe_cut(self, armed)
                        self.proxy._observe_reply(self, cmd, reply, dropped=True)
                        self._close_if_due()
                        armed.fired.set()
                        continue
                    self.proxy._observe_reply(self, cmd, reply, dropped=False)
                    _send(self.client, reply)
                    self.relayed += 1
                    self._close_if_due()
            del buf[:pos]


def reply_end(buf: bytes | bytearray, start: int) -> int | None:
    """The offset past the (RESP2 or RESP3) reply at ``buf[start:]``, None while
    incomplete."""
    end = buf.find(b"\r\n", start)
    if end < 0:
        return None
    kind, head = buf[start:start + 1], bytes(buf[start + 1:end])
    pos = end + 2
    if kind in (b"$", b"=", b"!"):  # a blob (or null: -1)
        size = int(head)
        if size < 0:
            return pos
        return pos + size + 2 if len(buf) >= pos + size + 2 else None
    if kind in (b"*", b"~", b">", b"%", b"|"):  # an aggregate (a map: pairs)
        count = int(head)
        count *= 2 if kind in (b"%", b"|") else 1
        for _ in range(max(count, 0)):
            nxt = reply_end(buf, pos)
            if nxt is None:
                return None
            pos = nxt
        if kind == b"|":  # attributes come before the reply they describe
            return reply_end(buf, pos)
        return pos
    return pos  # a line: + - : _ , # (


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
