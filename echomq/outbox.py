"""The transactional outbox: ``Queue.add(..., tx=conn)`` writes the job into the outbox
table on the caller's SQLAlchemy Connection or Session, inside its transaction.

Rolled back, the job never exists; committed, the leader scheduler admits it to Valkey
(idempotent on its id) and deletes the row (:mod:`echomq.supervisor.relay`). On
PostgreSQL the insert is followed by ``pg_notify('emq_outbox', queue)`` in the same
transaction, so the relay's LISTEN connection is woken at commit.

A job is stored as its admit takes it (the admit script's arguments); a delay becomes an
absolute due time at the write, so the wait counts from the add, not from the relay. Each
row carries a random token of its own: the relay's guard and this process's result()
wait on the doorbell of that row (lua/relayguard.lua), so a later add of the same id is
a new add, not one the relay took before.
"""

from __future__ import annotations

import json
import secrets
import time
import weakref
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, insert, inspect, text
from sqlalchemy.orm import Session

from echomq import durable
from echomq.admit import Spec
from echomq.errors import OutboxError
from echomq.floor.schema import outbox

CHANNEL = "emq_outbox"  # the NOTIFY channel the relay LISTENs on
_FIX = ("create it with `echomq-supervisor migrate --floor-url URL` on this database (the "
        "floor's, or the one `echomq-supervisor start --outbox-url` names)")
_checked: set[str] = set()  # databases (rendered URLs) known to hold the outbox table
_checked_engines: weakref.WeakSet[Engine] = weakref.WeakSet()  # the same, by engine: no render


TOKEN_BYTES = 8  # a row's token: random, so no two adds of one id share a doorbell


def rows(queue: str, specs: Sequence[Spec]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The outbox rows of these validated jobs, and their tokens by job id."""
    now = time.time_ns() // 1_000_000
    out = []
    tokens = {}
    for job_id, args, due in specs:
        at = None if due is None else (now - due if due < 0 else due)
        token = tokens[job_id] = secrets.token_hex(TOKEN_BYTES)
        out.append({"queue": queue, "job_id": job_id, "created_ms": now,
                    "spec": json.dumps({"args": args, "due": at, "t": token},
                                       separators=(",", ":"))})
    return out, tokens


_MARKERS = {"qmark": "?", "format": "%s", "numeric": ":{n}", "named": ":{name}",
            "pyformat": "%({name})s"}
_COLUMNS = ("queue", "job_id", "spec", "created_ms")
# PostgreSQL: any number of rows in one statement of fixed text (so each driver's and
# SQLAlchemy's caches keep it), the NOTIFY in the same statement: one round trip
_PG_WRITE = (f"WITH emq_rows AS (INSERT INTO {outbox.name} ({', '.join(_COLUMNS)}) "
             "SELECT CAST({queue} AS TEXT), r.job_id, r.spec, CAST({now} AS BIGINT) "
             "FROM json_to_recordset(CAST({rows} AS JSON)) AS r(job_id TEXT, spec TEXT)) "
             "SELECT pg_notify({channel}, {queue})")
_PG_NAMES = ("queue", "now", "rows", "channel")
_PG_STATEMENT = text(_PG_WRITE.format(**{n: f":{n}" for n in _PG_NAMES}))


def _pg_params(queue: str, values: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rows as one JSON document (a driver's array adapter escapes each item in
    Python; json.dumps does it in C)."""
    doc = json.dumps([{"job_id": v["job_id"], "spec": v["spec"]} for v in values],
                     separators=(",", ":"))
    return {"queue": queue, "now": values[0]["created_ms"], "rows": doc, "channel": CHANNEL}


def write_cursor(cursor: Any, queue: str, specs: Sequence[Spec], *,
                 paramstyle: str = "format", postgresql: bool = False) -> None:
    """:func:`write` through a DB-API cursor (a framework's own connection, e.g. Django's),
    in whatever transaction it is in: the same rows, and on PostgreSQL the same one
    statement with its ``pg_notify``. ``paramstyle``: the driver's (PEP 249). The caller
    checks the table."""
    if paramstyle not in _MARKERS:
        raise ValueError(f"paramstyle must be one of {', '.join(_MARKERS)}, got {paramstyle!r}")
    by_name = paramstyle in ("named", "pyformat")
    values, tokens = rows(queue, specs)
    if not values:
        return
    if postgresql:
        params = _pg_params(queue, values)
        if by_name:
            sql = _PG_WRITE.format(**{n: _MARKERS[paramstyle].format(name=n)
                                      for n in _PG_NAMES})
            cursor.execute(sql, params)
        else:  # positional: {queue} is used twice, so each use takes its own marker
            order: list[str] = []

            def marker(name: str) -> str:
                order.append(name)
                return _MARKERS[paramstyle].format(n=len(order), name=name)

            sql = _PG_WRITE
            for name in ("queue", "now", "rows", "channel", "queue"):
                sql = sql.replace("{" + name + "}", marker(name), 1)
            cursor.execute(sql, tuple(params[n] for n in order))
    else:
        insert_sql = (f"INSERT INTO {outbox.name} ({', '.join(_COLUMNS)}) VALUES ("
                      + ", ".join(_MARKERS[paramstyle].format(n=i + 1, name=c)
                                  for i, c in enumerate(_COLUMNS)) + ")")
        cursor.executemany(insert_sql, [{c: r[c] for c in _COLUMNS} if by_name
                                        else tuple(r[c] for c in _COLUMNS) for r in values])
    durable.note_outboxed(queue, tokens)


def sync_connection(tx: Any) -> Connection:
    """The Connection a ``tx=`` writes through: a Connection, or a Session's own."""
    if isinstance(tx, Connection):
        return tx
    if isinstance(tx, Session):
        return tx.connection()
    raise OutboxError(_unsupported(tx))


def write(tx: Any, queue: str, specs: Sequence[Spec]) -> None:
    """Insert these jobs into the outbox on ``tx``'s transaction (and NOTIFY on PostgreSQL,
    in the same one statement). Raises OutboxError, before writing anything, for a ``tx``
    of another type or a database without the outbox table."""
    conn = sync_connection(tx)
    if conn.engine not in _checked_engines:
        key = conn.engine.url.render_as_string(hide_password=True)
        if key not in _checked:
            if not inspect(conn).has_table(outbox.name):
                raise OutboxError(f"tx=: the database {key} has no outbox table "
                                  f"({outbox.name}); {_FIX}. Nothing was written")
            _checked.add(key)
        _checked_engines.add(conn.engine)
    values, tokens = rows(queue, specs)
    if not values:
        return
    if conn.dialect.name == "postgresql":
        conn.execute(_PG_STATEMENT, _pg_params(queue, values))
    else:
        conn.execute(insert(outbox), values)
    durable.note_outboxed(queue, tokens)  # result() waits across the relay


async def write_async(tx: Any, queue: str, specs: Sequence[Spec]) -> None:
    """:func:`write` for an AsyncConnection or AsyncSession: the same statements, awaited
    in the caller's transaction."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(tx, AsyncSession):
        tx = await tx.connection()
    if not isinstance(tx, AsyncConnection):
        raise OutboxError(_unsupported(tx, asyncio=True))
    await tx.run_sync(lambda conn: write(conn, queue, specs))


def _unsupported(tx: Any, asyncio: bool = False) -> str:
    kinds = ("sqlalchemy.ext.asyncio.AsyncConnection or AsyncSession" if asyncio
             else "sqlalchemy.Connection or sqlalchemy.orm.Session")
    return (f"tx= takes a {kinds} inside an open transaction, got {type(tx).__name__}; "
            "nothing was written")

