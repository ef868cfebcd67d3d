"""The outbox relay: the leader scheduler admits jobs committed into the outbox table
(``Queue.add(..., tx=conn)``) and deletes their rows.

One batch per call, in one transaction on the outbox's database: read the queue's oldest
rows (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; on SQLite under the write lock, taken
first), under the "durable" dial write them to the floor, admit them (admit.lua /
schedule.lua, idempotent on the job id) and mark them, then delete the rows. A failure
anywhere leaves the rows for the next call, which admits nothing twice (an id that
exists is left as it is); a floor that refuses fails the batch before its admit.

On PostgreSQL through psycopg 3 a batch is two round trips to the database: ``BEGIN``
travels with the ``SELECT`` and ``COMMIT`` with the ``DELETE``, on a pool of the relay's
own that tests no connection at checkout. A connection found dead at its first statement
(a restart, an idle timeout) empties that pool, and the batch runs once more at once on
a new connection. A batch that fails closes its connection: the server rolls the
transaction back and its row locks go. An outbox URL naming another driver (psycopg2)
takes SQLAlchemy's path: the engine's own pool, its pre-ping, one statement a trip.

On PostgreSQL, :class:`Listener` holds a dedicated ``LISTEN emq_outbox`` connection and
pokes the queue's scheduler thread at each commit's NOTIFY; while it is lost (it
reconnects with a growing pause) the relay runs each beat, as it always does on SQLite.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import redis
from echomq.supervisor.outboxrows import parse_row, set_aside
from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import SQLAlchemyError

from echomq import durable, scripts
from echomq.admit import AdmitPlanner
from echomq.config import QueueSettings
from echomq.errors import FloorError
from echomq.floor.engine import WRITE_OPTION, make_engine
from echomq.floor.forkgate import GATE
from echomq.floor.schema import outbox
from echomq.outbox import CHANNEL
from echomq.tracing import producer_span

log = logging.getLogger("echomq.relay")
RELAY_BATCH = 500
RELAY_CONNECT_TIMEOUT_S = 2
RELAY_STATEMENT_TIMEOUT_MS = 5000
RELAY_LOCK_TIMEOUT_MS = 2000  # a table lock (a migration) fails the batch before that bound
# a relay stopped between its read and its commit (a frozen process) has its session ended
# by the server after this, so its rows' locks go and the next leader relays them (its own
# admit, if it resumes, is refused: its lease is gone)
RELAY_IDLE_IN_TX_MS = 30_000
_engines: dict[str, Engine] = {}  # the relay's own PostgreSQL pools, by URL
_engines_lock = threading.Lock()


def _driver_errors() -> tuple[type[BaseException], ...]:
    try:
        import psycopg
    except ImportError:
        return ()
    return (psycopg.Error,)


class Relay:
    """Admits one queue's committed outbox rows."""

    def __init__(self, queue: str, client: redis.Redis, engine: Engine) -> None:
        self.queue = queue
        self.client = client
        self.engine = engine
        self.planner = AdmitPlanner(queue, QueueSettings())
        self.relayed = 0
        self.error = ""
        self._select_sql: str | None = None  # PostgreSQL: BEGIN and the batch's SELECT
        self.leader = ""  # the leader lease's value of the run in progress

    def run(self, floor: Any = None, durable_dial: bool = False, leader: str = "") -> int:
        """Relay batches until the queue's outbox is empty (or a batch fails: logged, the
        rows stay for the next call). Returns the jobs relayed. ``leader``: the value of
        the scheduler's leader lease this relay runs under ("<replica>|<fence>"); an admit
        is refused once another holds it."""
        self.leader = leader
        total = 0
        errors = (SQLAlchemyError, FloorError, redis.RedisError, OSError, StaleConnection,
                  *_driver_errors())
        retried = False
        while True:
            try:
                n = self._batch(floor if durable_dial else None)
            except errors as exc:
                if isinstance(exc, StaleConnection) and not retried:
                    retried = True  # a pooled connection the server had closed: a new one
                    continue
                if str(exc) != self.error:
                    log.warning("queue %s: outbox relay failed, retrying next beat: %s",
                                self.queue, str(exc).splitlines()[0] if str(exc) else exc)
                self.error = str(exc)
                return total
            self.error = ""
            total += n
            if n < RELAY_BATCH:
                return total

    def _batch(self, floor: Any) -> int:
        """One batch: its admit guards its rows a day, until their delete commits (the
        rows of a batch that failed after its admit are read again when the database is
        back, however late: their jobs are not admitted again, though one may have
        finished and been dropped by retention meanwhile)."""
        if self.engine.dialect.name == "postgresql" and self.engine.driver == "psycopg":
            return self._batch_pg(floor)
        return self._batch_sqlalchemy(floor)

    def _batch_sqlalchemy(self, floor: Any) -> int:
        """One batch through SQLAlchemy: SQLite, or PostgreSQL on another driver."""
        postgresql = self.engine.dialect.name == "postgresql"
        stmt = (select(outbox.c.id, outbox.c.job_id, outbox.c.spec)
                .where(outbox.c.queue == self.queue).order_by(outbox.c.id).limit(RELAY_BATCH))
        if postgresql:
            stmt = stmt.with_for_update(skip_locked=True)
        # SQLite: inside the fork gate, as the floor's own calls (no fork mid-transaction),
        # and BEGIN IMMEDIATE: the write lock is taken before the admit, so a lock held by
        # the application fails the batch before it admits anything, never at its DELETE
        gate = nullcontext() if postgresql else GATE.inside()
        engine = self.engine if postgresql else \
            self.engine.execution_options(**{WRITE_OPTION: True})
        with gate, engine.begin() as conn:
            rows = conn.execute(stmt).all()
            if not rows:
                return 0
            # the floor in the same SQLite file: written in this transaction, which holds
            # that file's write lock (another connection would wait for it)
            same = conn if floor is not None and not postgresql and \
                _same_file(floor.engine, self.engine) else None
            relayed = self._admit(rows, floor, same)
            conn.execute(delete(outbox).where(outbox.c.id.in_([r[0] for r in rows])))
        return self._relayed(relayed, len(rows))

    def _batch_pg(self, floor: Any) -> int:
        """One batch on PostgreSQL: ``BEGIN`` and the ``SELECT`` in one round trip, the
        admit, then the ``DELETE`` and ``COMMIT`` in another."""
        engine = _relay_engine(self.engine)
        if self._select_sql is None:
            stmt = (select(outbox.c.id, outbox.c.job_id, outbox.c.spec)
                    .where(outbox.c.queue == self.queue).order_by(outbox.c.id)
                    .limit(RELAY_BATCH).with_for_update(skip_locked=True))
            self._select_sql = "BEGIN; " + _literal(stmt, engine)
        with engine.connect() as conn:
            dbapi = conn.connection.driver_connection
            try:
                try:
                    cursor = dbapi.execute(self._select_sql)  # type: ignore[union-attr]
                except _driver_errors() as exc:
                    if getattr(dbapi, "closed", False):  # dead before it was used
                        conn.invalidate()
                        engine.dispose()  # its siblings in the pool died with it, likely
                        raise StaleConnection() from exc
                    raise
                cursor.nextset()
                rows = cursor.fetchall()
                if not rows:
                    dbapi.execute("COMMIT")  # type: ignore[union-attr]
                    return 0
                relayed = self._admit(rows, floor, None)
                ids = delete(outbox).where(outbox.c.id.in_([int(r[0]) for r in rows]))
                dbapi.execute(_literal(ids, engine) + "; COMMIT")  # type: ignore[union-attr]
            except BaseException:
                conn.invalidate()  # closed: the server rolls back and the row locks go
                raise
        return self._relayed(relayed, len(rows))

    def _admit(self, rows: Sequence[Any], floor: Any, same: Any) -> list[tuple[str, str]]:
        """Admit a batch's rows (under "durable", their floor rows first), guarded;
        returns each admitted row's job id and token. A row that holds no admit of its
        job is set aside (dead with the reason) and leaves with the batch."""
        specs, tokens, bad = [], [], []
        for row_id, job_id, text in rows:
            parsed = parse_row(job_id, text)
            if isinstance(parsed, str):
                bad.append((int(row_id), job_id, text, parsed))
                continue
            specs.append(parsed[0])
            # a row an earlier version wrote has no token: its row id stands in
            tokens.append(parsed[1] or f"row{row_id}")
        if bad or (specs and floor is not None):
            # a relay stalled since its read buries nothing and writes no floor row (its
            # admit is checked again in the script, atomically)
            self._check_leads()
        if bad:
            set_aside(self.client, self.planner.keys, self.queue, bad)
        if not specs:
            return []
        relayed = list(zip((s[0] for s in specs), tokens, strict=True))
        # a PRODUCER span of its own ("relay", the count): each job keeps the context
        # of the add that wrote it, so its CONSUMER span links to that add's span
        with producer_span(self.queue, "relay", len(specs)):
            if floor is not None:  # the rows first: a floor that refuses admits nothing
                done = durable.relayed_rows(self.client, self.planner.keys, relayed,
                                            rolled_back=same is not None)
                durable.write_before_admit(
                    floor, self.planner.keys, [s for s, d in zip(specs, done, strict=True)
                                               if not d], same)
            # guarded: a row a relay admitted before is not admitted again
            scripts.execute(self.client, self.planner.calls(
                specs, durable.RELAY_HELD_MS, tokens, self.leader))
            if floor is not None:
                durable.mark(self.client, self.planner.keys, [s[0] for s in specs])
        return relayed

    def _check_leads(self) -> None:
        """Raise NotLeader when the leader lease this relay runs under is another's (the
        admit script checks it again, atomically with the admit)."""
        if not self.leader:
            return
        held = self.client.get(self.planner.keys.leader)
        if (held.decode() if isinstance(held, bytes) else held) != self.leader:
            raise NotLeader("NOTLEADER the relay's scheduler no longer leads this queue")

    def _relayed(self, relayed: Sequence[tuple[str, str]], rows: int) -> int:
        """After the batch's delete committed (``rows`` rows): their guards are no longer
        needed, and their doorbells stay a minute for result() waiters (which went on at
        the admit). Returns ``rows``."""
        if relayed:
            durable.trim_relayed(self.client, self.planner.keys, relayed)
        self.relayed += len(relayed)
        return rows


class NotLeader(redis.RedisError):
    """The relay's scheduler lost the queue's leader lease since it read the rows."""


class StaleConnection(Exception):
    """The relay's pooled connection was found closed at its first statement."""

    def __str__(self) -> str:
        return f"the outbox's database closed the relay's connection: {self.__cause__}"


def _literal(stmt: Any, engine: Engine) -> str:
    """A statement's SQL with its values written in (no parameters: PostgreSQL's simple
    query protocol, which takes two statements in one round trip). The values are the
    validated queue name, the batch size and integer row ids."""
    return str(stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))


def close_relay_pools() -> None:
    """Close the relay's own PostgreSQL connections (at the supervisor's exit)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()


def _relay_engine(engine: Engine) -> Engine:
    """The relay's own pool on ``engine``'s PostgreSQL database, one per URL: autocommit
    (the relay sends its own BEGIN) and no pre-ping."""
    url = engine.url.render_as_string(hide_password=False)
    with _engines_lock:
        own = _engines.get(url)
        if own is None:
            own = _engines[url] = make_engine(
                url, connect_timeout_s=RELAY_CONNECT_TIMEOUT_S,
                statement_timeout_ms=RELAY_STATEMENT_TIMEOUT_MS,
                lock_timeout_ms=RELAY_LOCK_TIMEOUT_MS, pre_ping=False,
                autocommit=True, idle_in_transaction_ms=RELAY_IDLE_IN_TX_MS)
        return own


class Listener:
    """A dedicated LISTEN connection on PostgreSQL: each NOTIFY on the outbox channel
    pokes the scheduler of the queue it names."""

    def __init__(self, engine: Engine, poke: Callable[[str], None]) -> None:
        # imported here, in the main thread before any consumer is forked: the floor may
        # use another driver, and psycopg's import may run a subprocess to find libpq,
        # whose pipe a fork beside the listening thread would keep open (crontab.py)
        try:
            import psycopg
        except ImportError:  # an outbox on psycopg2 alone: no LISTEN, the relay's beat
            psycopg = None
        self._psycopg = psycopg
        self.engine = engine
        self.poke = poke
        self.connected = threading.Event()
        self.connects = 0  # connections made (a reconnect after a loss counts again)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="echomq-outbox-listen",
                                        daemon=True)

    def start(self) -> None:
        """Start listening (a daemon thread); without psycopg (3) installed, say so and
        leave the relay to its beat."""
        if self._psycopg is None:
            log.warning("outbox LISTEN needs psycopg (3), which is not installed: the relay "
                        "runs each beat (pip install 'psycopg[binary]')")
            return
        self._thread.start()

    def close(self) -> None:
        """Stop listening, waiting a bounded time for the thread."""
        self._stop.set()
        self._thread.join(2.0)

    def _run(self) -> None:
        psycopg = self._psycopg
        url = self.engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False)
        pause = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connects += 1
                    self.connected.set()
                    pause = 0.1
                    self._poke("")  # rows committed while not listening: relay them now
                    while not self._stop.is_set():
                        # a bounded wait, so a stop is seen within it
                        for note in conn.notifies(timeout=1.0):
                            self._poke(note.payload)
            except psycopg.Error as exc:
                if self.connected.is_set():
                    log.warning("outbox LISTEN connection lost (the relay runs each beat "
                                "until it is back): %s", exc)
                self.connected.clear()
                # no event tells that the database is back: retry after a growing pause
                self._stop.wait(pause)
                pause = min(pause * 2, 5.0)
        self.connected.clear()

    def _poke(self, queue: str) -> None:
        """Poke, logging a failure: it must not end the thread (nothing would restart it,
        and every later commit would wait for a beat)."""
        try:
            self.poke(queue)
        except Exception:
            log.exception("outbox LISTEN: waking the relay of %r failed", queue or "every queue")


def _same_file(a: Engine, b: Engine) -> bool:
    """True when two SQLite engines open the same database file."""
    import os

    files = [e.url.database for e in (a, b)]
    return None not in files and len({os.path.realpath(str(f)) for f in files}) == 1


def open_outbox(url: str | None, floor: Any) -> Engine | None:
    """The outbox's database: the one ``--outbox-url`` names, else the floor's (None
    without either)."""
    if url:
        from echomq.floor.engine import make_engine

        return make_engine(url, connect_timeout_s=2, statement_timeout_ms=5000)
    return floor.engine if floor is not None else None
