"""Engine creation for the floor, and URL redaction for its error messages."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from echomq.connection import redact_url as redact_text_url
from echomq.connection import unencoded_password
from echomq.errors import FloorError
from echomq.floor.forkgate import GATE

#: Execution option that makes a SQLite transaction start with BEGIN IMMEDIATE.
WRITE_OPTION = "emq_write"

SQLITE_BUSY_TIMEOUT_MS = 5000
PG_CONNECT_TIMEOUT_S = 10
#: Bounds on one PostgreSQL statement and on its wait for a lock (server side).
PG_STATEMENT_TIMEOUT_MS = 30_000
PG_LOCK_TIMEOUT_MS = 10_000
#: Bound on unacknowledged data and dead peers (client side, TCP): a server that
#: stops answering mid-statement (paused, partitioned) fails the call instead of
#: hanging it until the kernel gives up after ~15 minutes.
PG_TCP_USER_TIMEOUT_MS = 30_000
PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                 "keepalives_count": 3}

def redact_url(url: str | URL) -> str:
    """Return ``url`` with any password (userinfo, ``?password=``, ``?sslpassword=``...)
    replaced by ``***``, found by parsing (:func:`echomq.connection.redact_url`).

    Works on text that does not parse as a URL too, so error paths can always
    call it.
    """
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else str(url)
    return redact_text_url(text)


def normalize_url(url: str) -> URL:
    """Parse a floor URL, choosing psycopg 3 for PostgreSQL.

    Accepts ``sqlite:///path`` and ``postgresql://`` / ``postgres://`` (with or
    without an explicit ``+driver``); anything else is a :class:`FloorError`. A
    relative SQLite path is made absolute from the working directory.
    """
    text = str(url).strip()
    if text.startswith("postgres://"):
        text = "postgresql://" + text[len("postgres://") :]
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):
        # from None: the parser's message may quote the URL, password included (a port
        # that does not parse because an '@' in the password moved the host).
        raise FloorError(f"invalid floor URL {redact_url(text)!r}") from None
    if unencoded_password(text) and "@" in (parsed.host or "") + str(parsed.port or ""):
        # SQLAlchemy ends the password at its first '@': the rest would be the host
        raise FloorError(f"invalid floor URL {redact_url(text)!r}: its password holds an "
                         "'@': percent-encode it (%40)")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    database = parsed.database
    if (backend == "sqlite" and database and database != ":memory:"
            and not database.startswith("file:") and not os.path.isabs(database)):
        # two processes started in different directories must not open two floors
        parsed = parsed.set(database=os.path.abspath(database))
    if backend not in ("sqlite", "postgresql"):
        raise FloorError(
            f"unsupported floor URL {redact_url(text)!r}: expected sqlite:///PATH or "
            "postgresql://USER:PASSWORD@HOST/DB"
        )
    return parsed


def make_engine(url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
                connect_timeout_s: int = PG_CONNECT_TIMEOUT_S,
                statement_timeout_ms: int = PG_STATEMENT_TIMEOUT_MS,
                lock_timeout_ms: int = PG_LOCK_TIMEOUT_MS,
                tcp_user_timeout_ms: int = PG_TCP_USER_TIMEOUT_MS,
                pre_ping: bool = True, autocommit: bool = False,
                idle_in_transaction_ms: int = 0) -> Engine:
    """Create the floor's engine for a SQLite or PostgreSQL URL.

    Every wait of one call is bounded: on SQLite the wait for a locked file
    (``busy_timeout``); on PostgreSQL the connect, each statement
    (``statement_timeout``), its wait for a row or table lock (``lock_timeout``)
    and an unanswering server (TCP keepalives and ``tcp_user_timeout``). A bound
    that fires raises, and the caller's error handling takes over. Settings
    given in the URL's query win over these. On PostgreSQL, ``pre_ping`` tests a
    pooled connection with a round trip at each checkout, and ``autocommit``
    leaves transactions to the caller's own ``BEGIN`` (the outbox relay's, which
    sends it with its first statement). ``idle_in_transaction_ms`` (PostgreSQL, 0 for
    none): the server ends a session left idle that long inside a transaction, rolling
    it back and freeing its row locks (a process stopped mid-transaction).
    """
    parsed = normalize_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = create_engine(parsed)
            _tune_sqlite(engine, busy_timeout_ms)
            GATE.watch(engine)  # no fork while another thread is inside SQLite
            return engine
        connect_args = _pg_connect_args(parsed, connect_timeout_s, statement_timeout_ms,
                                        lock_timeout_ms, tcp_user_timeout_ms,
                                        idle_in_transaction_ms)
        options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        return create_engine(parsed, pool_pre_ping=pre_ping, connect_args=connect_args,
                             **options)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise FloorError(f"cannot create floor engine for {redact_url(parsed)}: {exc}") from exc


def _pg_connect_args(parsed: URL, connect_timeout_s: int, statement_timeout_ms: int,
                     lock_timeout_ms: int, tcp_user_timeout_ms: int,
                     idle_in_transaction_ms: int = 0) -> dict[str, Any]:
    """libpq connection parameters bounding every wait, unless the URL sets them."""
    args: dict[str, Any] = {"connect_timeout": connect_timeout_s,
                            "tcp_user_timeout": tcp_user_timeout_ms, **PG_KEEPALIVES}
    args = {k: v for k, v in args.items() if k not in parsed.query}
    if "options" not in parsed.query:
        args["options"] = (f"-c statement_timeout={int(statement_timeout_ms)} "
                           f"-c lock_timeout={int(lock_timeout_ms)}")
        if idle_in_transaction_ms > 0:
            args["options"] += (" -c idle_in_transaction_session_timeout="
                                f"{int(idle_in_transaction_ms)}")
    return args


def _tune_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    """Per-connection pragmas and explicit BEGIN, after SQLAlchemy's documented recipe.

    The sqlite3 driver's legacy transaction control is switched off
    (``isolation_level = None``) and SQLAlchemy emits BEGIN itself: plain
    BEGIN (deferred) for reads, BEGIN IMMEDIATE for writes. A deferred
    transaction that later writes cannot wait for the lock (SQLite returns
    SQLITE_BUSY at once to avoid a deadlock); IMMEDIATE takes the write lock
    up front, so ``busy_timeout`` queues concurrent writers instead.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # busy_timeout first: switching to WAL needs a lock another process may hold.
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
