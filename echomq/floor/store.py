"""The floor: durable job rows on SQLite or PostgreSQL, fenced by the scheduler's leader term.

Every method is synchronous and runs one short transaction. Writes take the
caller's leader ``fence`` and fail with :class:`StaleFence` when a newer
leader has already written, so a deposed scheduler cannot undo its
successor's work.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import (
    Connection,
    Engine,
    String,
    any_,
    bindparam,
    case,
    delete,
    false,
    func,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from echomq.errors import FloorError, FloorSchemaError, StaleFence
from echomq.floor.engine import WRITE_OPTION, make_engine, redact_url
from echomq.floor.forkgate import GATE
from echomq.floor.schema import VERSION_TABLE, crons, fences, jobs, lane_limits

# Ids per IN (...) list: well under SQLite's and PostgreSQL's bound-parameter limits.
_CHUNK = 500
# pg_advisory_xact_lock key serialising concurrent `migrate` runs ("EMQFLOOR").
_MIGRATE_LOCK = 0x454D51464C4F4F52


@dataclass(frozen=True)
class FloorRow:
    """One job on the floor: its id, due time (ms since the epoch) and Redis hash.

    ``error`` says why a stored row could not be read (its fields are then empty)."""

    job_id: str
    due_ms: int
    fields: dict[str, str]
    spilled: bool = False
    error: str | None = None
    seq: int | None = None  # a "durable" producer's admit order (rehydration keeps it)


class Floor:
    """Batched, fenced access to the floor's tables."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{WRITE_OPTION: True})
        self._pg = engine.dialect.name == "postgresql"
        # SQLite: every call is inside the fork gate from end to end (a new connection's
        # connect-time pragmas and a dispose's closes happen outside any checkout)
        self._sqlite = engine.dialect.name == "sqlite"
        self._password = engine.url.password
        self.url_redacted = redact_url(engine.url)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine under this floor (the outbox relay reads through it)."""
        return self._engine

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> Floor:
        """Open a floor on ``sqlite:///PATH`` or ``postgresql://...`` (connects lazily).
        ``engine_options`` go to :func:`make_engine` (busy_timeout_ms, connect_timeout_s)."""
        return cls(make_engine(url, **engine_options))

    def pause_for_fork(self) -> bool:
        """Before ``os.fork()``: True when no call is under way; every pooled SQLite
        connection is then closed (nothing of SQLite's state crosses the fork) and calls
        wait until :meth:`resume_after_fork`. False when a call is under way: fork later.
        Always True on PostgreSQL (its connections are sockets the child forgets)."""
        if not self._sqlite:
            return True
        if not GATE.try_pause():
            return False
        self._engine.dispose()
        return True

    def resume_after_fork(self) -> None:
        """In the parent, after the fork that :meth:`pause_for_fork` allowed."""
        if self._sqlite:
            GATE.resume()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the pool without closing the parent's connections."""
        self._engine.dispose(close=False)

    def dispose(self) -> None:
        """Close every pooled connection."""
        with self._gated():
            self._engine.dispose()

    def __enter__(self) -> Floor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.dispose()

    def __repr__(self) -> str:
        return f"Floor({self.url_redacted!r})"

    # -- schema ---------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> None:
        """Run the shipped migrations up to ``revision``."""
        self._migrate(command.upgrade, revision)

    def downgrade(self, revision: str) -> None:
        """Run the shipped migrations down to ``revision`` (``"base"`` drops everything)."""
        self._migrate(command.downgrade, revision)

    def current_revision(self) -> str | None:
        """The revision the database is at, or None when it was never migrated."""
        with self._guard("reading the schema revision"), self._engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()

    def head_revision(self) -> str:
        """The newest revision among the migrations shipped with this package."""
        head = ScriptDirectory.from_config(self._alembic_config()).get_current_head()
        if head is None:
            raise FloorError("no floor migrations in the installed 'echomq.migrations' package")
        return head

    def check_at_head(self) -> None:
        """Raise :class:`FloorSchemaError` unless the schema is at the shipped head."""
        current, head = self.current_revision(), self.head_revision()
        if current == head:
            return
        hint = f"run `echomq-supervisor migrate --floor-url {self.url_redacted}`"
        if current is not None and not self._known(current):
            hint = f"it was migrated by a newer EchoMQ: upgrade EchoMQ, then {hint}"
        raise FloorSchemaError(
            f"floor schema is at revision {current or 'base (empty)'} but this EchoMQ needs "
            f"revision {head}; {hint}"
        )

    # -- writes ---------------------------------------------------------------

    def upsert(self, queue: str, rows: Sequence[FloorRow], fence: int | None) -> int:
        """Insert rows or update their due time, spilled flag and fields. Returns rows written."""
        if not rows:
            return 0
        now = _now_ms()
        # Last one wins for a repeated id, as it would applied one by one.
        unique = {row.job_id: row for row in rows}
        params = [
            {
                "queue": queue,
                "job_id": row.job_id,
                "due_ms": row.due_ms,
                "spilled": row.spilled,
                "fields": _dump(row.fields),
                "created_ms": now,
                "updated_ms": now,
            }
            for row in unique.values()
        ]
        stmt = self._insert(jobs)
        stmt = stmt.on_conflict_do_update(
            index_elements=[jobs.c.queue, jobs.c.job_id],
            set_={
                name: stmt.excluded[name] for name in ("due_ms", "spilled", "fields", "updated_ms")
            },
        )
        with self._write("upsert", queue, fence) as conn:
            conn.execute(stmt, params)  # executemany: one prepared statement, many rows
        return len(params)

    def write_through(self, queue: str, rows: Sequence[FloorRow],
                      conn: Connection | None = None) -> int:
        """A producer's or consumer's write (durability "sync"), unfenced: insert the rows
        (not spilled), or update those not spilled. A spilled row is the leader's alone:
        the job left Valkey after this write's read, and only a restore may unspill it.
        ``conn``: a transaction of the caller's on this floor's database to write in (the
        outbox relay's, on a SQLite file it holds the write lock of). Returns the rows sent."""
        if not rows:
            return 0
        now = _now_ms()
        unique = {row.job_id: row for row in rows}
        params = [
            {"queue": queue, "job_id": row.job_id, "due_ms": row.due_ms, "spilled": False,
             "fields": _dump(row.fields), "created_ms": now, "updated_ms": now,
             "seq": row.seq}
            for row in unique.values()
        ]
        stmt = self._insert(jobs)
        stmt = stmt.on_conflict_do_update(
            index_elements=[jobs.c.queue, jobs.c.job_id],
            set_={name: stmt.excluded[name] for name in ("due_ms", "fields", "updated_ms")},
            where=jobs.c.spilled == false(),
        )
        if conn is not None:
            conn.execute(stmt, params)
            return len(params)
        with self._write("write_through", queue, None) as own:
            own.execute(stmt, params)
        return len(params)

    def close(self) -> None:
        """Close every pooled connection (same as :meth:`dispose`)."""
        self.dispose()

    def close_jobs(self, queue: str, job_ids: Iterable[str], fence: int | None) -> int:
        """Delete the rows of jobs that completed, died or were cancelled (``fence`` None:
        a producer's own cancel); returns how many existed."""
        ids = _unique(job_ids)
        if not ids:
            return 0
        closed = 0
        with self._write("close", queue, fence) as conn:
            if conn.dialect.name == "postgresql":  # one array parameter, whatever the count
                return int(conn.execute(_PG_CLOSE, {"queue": queue, "ids": ids}).rowcount)
            for chunk in _chunks(ids):
                stmt = delete(jobs).where(jobs.c.queue == queue, jobs.c.job_id.in_(chunk))
                closed += conn.execute(stmt).rowcount
        return closed

    def close_orphans(self, queue: str, job_ids: Iterable[str], fence: int) -> int:
        """Delete the rows of these jobs unless they are spilled (a row whose job finished
        but whose close was missed). Returns how many were deleted."""
        ids = _unique(job_ids)
        if not ids:
            return 0
        closed = 0
        with self._write("close_orphans", queue, fence) as conn:
            for chunk in _chunks(ids):
                stmt = delete(jobs).where(jobs.c.queue == queue, jobs.c.job_id.in_(chunk),
                                          jobs.c.spilled == false())
                closed += conn.execute(stmt).rowcount
        return closed

    def mark_spilled(self, queue: str, job_ids: Iterable[str], fence: int) -> int:
        """Flag rows as held by the floor alone (no longer in Redis). Returns rows marked."""
        return self._set_spilled(queue, _unique(job_ids), True, fence, "mark_spilled")

    def restore_due(
        self,
        queue: str,
        until_ms: int,
        limit: int,
        fence: int,
        apply: Callable[[list[FloorRow]], None],
    ) -> int:
        """Hand spilled rows due before ``until_ms`` (earliest first) to ``apply``, then unspill.

        One transaction: if ``apply`` raises, nothing is marked and the error
        propagates. On PostgreSQL the rows are locked ``FOR UPDATE SKIP
        LOCKED``, so concurrent callers get disjoint rows. ``apply`` sees the
        rows as stored (``spilled=True``). Returns the number restored.
        """
        if limit <= 0:
            return 0
        stmt = (
            select(jobs.c.job_id, jobs.c.due_ms, jobs.c.fields)
            .where(jobs.c.queue == queue, jobs.c.spilled == true(), jobs.c.due_ms < until_ms)
            .order_by(jobs.c.due_ms, jobs.c.job_id)
            .limit(limit)
        )
        if self._pg:
            stmt = stmt.with_for_update(skip_locked=True)
        with self._write("restore_due", queue, fence) as conn:
            rows = [_row(job_id, due_ms, fields, True)
                    for job_id, due_ms, fields in conn.execute(stmt)]
            if not rows:
                return 0
            apply(rows)
            self._update_spilled(conn, queue, [row.job_id for row in rows], False)
        return len(rows)

    # -- crons ----------------------------------------------------------------

    def put_crons(self, queue: str, rows: Sequence[tuple[str, str, int]], fence: int | None,
                  *, only: bool = False) -> int:
        """Insert or replace crons given as (key, spec, last_ms); a stored last_ms that is
        later is kept. ``only``: delete the queue's other crons (the scheduler's mirror of
        Valkey). ``fence`` None: a producer's own write. Returns the rows written."""
        now = _now_ms()
        params = [{"queue": queue, "key": key, "spec": spec, "last_ms": last,
                   "updated_ms": now} for key, spec, last in {r[0]: r for r in rows}.values()]
        stmt = self._insert(crons)
        stmt = stmt.on_conflict_do_update(
            index_elements=[crons.c.queue, crons.c.key],
            set_={"spec": stmt.excluded.spec, "updated_ms": stmt.excluded.updated_ms,
                  "last_ms": case((stmt.excluded.last_ms > crons.c.last_ms,
                                   stmt.excluded.last_ms), else_=crons.c.last_ms)},
        )
        with self._write("put_crons", queue, fence) as conn:
            if params:
                conn.execute(stmt, params)
            if only:
                gone = delete(crons).where(crons.c.queue == queue)
                if params:
                    gone = gone.where(crons.c.key.not_in([p["key"] for p in params]))
                conn.execute(gone)
        return len(params)

    def drop_crons(self, queue: str, keys: Iterable[str], fence: int | None = None) -> int:
        """Delete these crons of ``queue``; returns how many existed."""
        dropped, names = 0, _unique(keys)
        if not names:
            return 0
        with self._write("drop_crons", queue, fence) as conn:
            for chunk in _chunks(names):
                dropped += conn.execute(delete(crons).where(
                    crons.c.queue == queue, crons.c.key.in_(chunk))).rowcount
        return dropped

    def crons_fired(self, queue: str, lasts: dict[str, int], fence: int) -> None:
        """Record the last admitted occurrence of each cron (never moving one back)."""
        if not lasts:
            return
        now = _now_ms()
        stmt = (update(crons)
                .where(crons.c.queue == queue, crons.c.key == bindparam("k"),
                       crons.c.last_ms < bindparam("last"))
                .values(last_ms=bindparam("last"), updated_ms=now))
        with self._write("crons_fired", queue, fence) as conn:
            conn.execute(stmt, [{"k": key, "last": last} for key, last in lasts.items()])

    def cron_rows(self, queue: str) -> list[tuple[str, str, int]]:
        """Every cron of ``queue`` as (key, spec, last_ms), by key."""
        stmt = (select(crons.c.key, crons.c.spec, crons.c.last_ms)
                .where(crons.c.queue == queue).order_by(crons.c.key))
        with self._guard("cron_rows"), self._engine.connect() as conn:
            return [(key, spec, int(last)) for key, spec, last in conn.execute(stmt)]

    # -- lane limits ----------------------------------------------------------

    def put_lane_limits(self, queue: str, limits: dict[str, str], fence: int) -> int:
        """Make the queue's lane limits these (lane, "*" the default -> value): the
        scheduler's copy of Valkey's limits hash. Only the lanes that changed are written
        (a lane per tenant: one change costs one row); returns how many rows changed."""
        now = _now_ms()
        current = select(lane_limits.c.lane, lane_limits.c.value).where(
            lane_limits.c.queue == queue)
        with self._write("put_lane_limits", queue, fence) as conn:
            stored = {lane: value for lane, value in conn.execute(current)}
            gone = [lane for lane in stored if lane not in limits]
            for chunk in _chunks(gone):
                conn.execute(delete(lane_limits).where(lane_limits.c.queue == queue,
                                                       lane_limits.c.lane.in_(chunk)))
            changed = [{"queue": queue, "lane": lane, "value": value, "updated_ms": now}
                       for lane, value in limits.items() if stored.get(lane) != value]
            if changed:
                stmt = self._insert(lane_limits)
                conn.execute(stmt.on_conflict_do_update(
                    index_elements=[lane_limits.c.queue, lane_limits.c.lane],
                    set_={"value": stmt.excluded.value,
                          "updated_ms": stmt.excluded.updated_ms}), changed)
        return len(gone) + len(changed)

    def lane_limit_rows(self, queue: str) -> dict[str, str]:
        """The queue's lane limits as the floor holds them (lane -> value)."""
        stmt = (select(lane_limits.c.lane, lane_limits.c.value)
                .where(lane_limits.c.queue == queue).order_by(lane_limits.c.lane))
        with self._guard("lane_limit_rows"), self._engine.connect() as conn:
            return {lane: value for lane, value in conn.execute(stmt)}

    # -- reads ----------------------------------------------------------------

    def open_rows(self, queue: str, after_job_id: str | None, limit: int) -> list[FloorRow]:
        """Up to ``limit`` rows of ``queue`` ordered by job id, after ``after_job_id``."""
        stmt = select(jobs.c.job_id, jobs.c.due_ms, jobs.c.fields, jobs.c.spilled).where(
            jobs.c.queue == queue
        )
        if after_job_id is not None:
            stmt = stmt.where(jobs.c.job_id > after_job_id)
        stmt = stmt.order_by(jobs.c.job_id).limit(limit)
        with self._guard("open_rows"), self._engine.connect() as conn:
            return [_row(job_id, due_ms, fields, bool(spilled))
                    for job_id, due_ms, fields, spilled in conn.execute(stmt)]

    def rows_in_order(self, queue: str, after: tuple[int, str] | None, limit: int
                      ) -> list[FloorRow]:
        """Up to ``limit`` rows of ``queue`` in admit order (a "durable" producer's ``seq``,
        rows without one first, then by job id), after the ``(seq, job_id)`` ``after``:
        rehydration's walk, which puts waiting jobs back on their lanes in that order."""
        order = func.coalesce(jobs.c.seq, 0)
        stmt = select(jobs.c.job_id, jobs.c.due_ms, jobs.c.fields, jobs.c.spilled,
                      order).where(jobs.c.queue == queue)
        if after is not None:
            stmt = stmt.where((order > after[0])
                              | ((order == after[0]) & (jobs.c.job_id > after[1])))
        stmt = stmt.order_by(order, jobs.c.job_id).limit(limit)
        with self._guard("rows_in_order"), self._engine.connect() as conn:
            return [FloorRow(r.job_id, r.due_ms, r.fields, r.spilled, r.error, int(seq))
                    for *cols, seq in conn.execute(stmt)
                    for r in [_row(cols[0], cols[1], cols[2], bool(cols[3]))]]

    def rows(self, queue: str, job_ids: Iterable[str]) -> list[FloorRow]:
        """The rows of these jobs that are on the floor (any order; absent ids are left out)."""
        ids = _unique(job_ids)
        found: list[FloorRow] = []
        with self._guard("rows"), self._engine.connect() as conn:
            for chunk in _chunks(ids):
                stmt = select(jobs.c.job_id, jobs.c.due_ms, jobs.c.fields, jobs.c.spilled).where(
                    jobs.c.queue == queue, jobs.c.job_id.in_(chunk))
                found += [_row(job_id, due_ms, fields, bool(spilled))
                          for job_id, due_ms, fields, spilled in conn.execute(stmt)]
        return found

    def count(self, queue: str, spilled: bool | None = None) -> int:
        """Rows of ``queue``; only spilled (or only unspilled) ones when ``spilled`` is given."""
        stmt = select(func.count()).select_from(jobs).where(jobs.c.queue == queue)
        if spilled is not None:
            stmt = stmt.where(jobs.c.spilled == spilled)
        with self._guard("count"), self._engine.connect() as conn:
            return int(conn.scalar(stmt) or 0)

    def ping(self) -> None:
        """Raise :class:`FloorError` unless the database answers."""
        with self._guard("ping"), self._engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    # -- internals ------------------------------------------------------------

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Re-raise driver errors as FloorError, with the URL's password hidden; on SQLite
        the whole call is inside the fork gate."""
        with self._gated():
            try:
                yield
            except DBAPIError as exc:
                detail = str(exc.orig if exc.orig is not None else exc).strip().splitlines()
                message = f"{type(exc.orig or exc).__name__}: {detail[0] if detail else ''}"
                if self._password:
                    message = message.replace(self._password, "***")
                raise FloorError(
                    f"floor {action} failed on {self.url_redacted}: {message}") from exc

    def _gated(self) -> Any:
        """The fork gate on SQLite (no fork while this thread is inside), else nothing."""
        return GATE.inside() if self._sqlite else nullcontext()

    @contextmanager
    def _write(self, action: str, queue: str, fence: int | None) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite) that has passed the fence check."""
        with self._guard(action), self._writer.begin() as conn:
            if fence is not None:  # None: a producer's own write (sync dial), not a leader's
                self._check_fence(conn, queue, fence)
            yield conn

    def _check_fence(self, conn: Connection, queue: str, fence: int) -> None:
        """Store ``fence`` for ``queue`` unless a larger one is stored (then StaleFence)."""
        current = select(fences.c.fence).where(fences.c.queue == queue)
        stored = conn.scalar(current)
        if stored == fence and self._pg:
            # A share lock, not an update: writers of the same term run side by side
            # (restore_due's SKIP LOCKED needs that), while a successor's bump waits
            # for this transaction to finish.
            stored = conn.scalar(current.with_for_update(read=True))
        if stored == fence:
            return
        if stored is None or stored < fence:
            bump = self._insert(fences).values(queue=queue, fence=fence)
            bump = bump.on_conflict_do_update(
                index_elements=[fences.c.queue],
                set_={"fence": bump.excluded.fence},
                where=fences.c.fence <= bump.excluded.fence,
            )
            conn.execute(bump)
            # Read back rather than trust rowcount, which drivers report unevenly for upserts.
            stored = conn.scalar(current)
            if stored == fence:
                return
        raise StaleFence(
            f"queue {queue!r}: fence {fence} is stale, the floor holds fence {stored} "
            "(another scheduler has taken over); nothing was written"
        )

    def _set_spilled(
        self, queue: str, ids: list[str], spilled: bool, fence: int, action: str
    ) -> int:
        if not ids:
            return 0
        with self._write(action, queue, fence) as conn:
            return self._update_spilled(conn, queue, ids, spilled)

    def _update_spilled(self, conn: Connection, queue: str, ids: list[str], spilled: bool) -> int:
        now, changed = _now_ms(), 0
        for chunk in _chunks(ids):
            stmt = (
                update(jobs)
                .where(jobs.c.queue == queue, jobs.c.job_id.in_(chunk))
                .values(spilled=spilled, updated_ms=now)
            )
            changed += conn.execute(stmt).rowcount
        return changed

    def _insert(self, table: Any) -> Any:
        return postgresql.insert(table) if self._pg else sqlite.insert(table)

    def _migrate(self, run: Callable[[Config, str], None], revision: str) -> None:
        with self._guard("migration"), self._writer.begin() as conn:
            if self._pg:
                # Replicas started together may all run `migrate`; one at a time.
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATE_LOCK})
            try:
                run(self._alembic_config(conn), revision)
            except CommandError as exc:
                raise FloorError(f"floor migration to {revision!r} failed: {exc}") from exc

    def _alembic_config(self, conn: Connection | None = None) -> Config:
        cfg = Config()
        cfg.set_main_option("script_location", _script_location())
        url = self._engine.url.render_as_string(hide_password=False)
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        if conn is not None:
            cfg.attributes["connection"] = conn
        return cfg

    def _known(self, revision: str) -> bool:
        try:
            script = ScriptDirectory.from_config(self._alembic_config())
            return script.get_revision(revision) is not None
        except CommandError:
            return False


def _script_location() -> str:
    """The installed ``echomq.migrations`` package, found as package data (works from a wheel)."""
    path = Path(str(files("echomq.migrations")))
    if not (path / "env.py").is_file():
        raise FloorError(f"floor migrations not found: {path / 'env.py'} is missing")
    return str(path)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _row(job_id: str, due_ms: Any, text: Any, spilled: bool) -> FloorRow:
    """A stored row; one that does not parse comes back with ``error`` set, never raises."""
    try:
        fields = json.loads(text)
        if not isinstance(fields, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
            raise ValueError("fields are not an object of strings")
        return FloorRow(job_id, int(due_ms), fields, spilled=spilled)
    except (TypeError, ValueError) as exc:
        error = f"floor row of job {job_id!r} cannot be read: {exc}"
        due = due_ms if isinstance(due_ms, int) else 0
        return FloorRow(job_id, due, {}, spilled=spilled, error=error[:500])


def _dump(fields: dict[str, str]) -> str:
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)


# PostgreSQL: the closed jobs' ids as one text[] parameter (an IN list binds, casts and
# prepares a parameter per id: most of a drain's floor work under the "durable" dial)
_PG_CLOSE = delete(jobs).where(
    jobs.c.queue == bindparam("queue"),
    jobs.c.job_id == any_(bindparam("ids", type_=postgresql.ARRAY(String))))


def _unique(job_ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(job_ids))


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]
