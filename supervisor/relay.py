"""The outbox relay: the leader scheduler admits jobs committed into the outbox table
(``Queue.add(..., tx=conn)``) and deletes their rows.

One batch per call, in one transaction on the outbox's database: read the queue's oldest
rows (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; on SQLite under the write lock, taken
first), under the "durable" dial write them to the floor, admit them (admit.lua /
schedule.lua, idempotent on the job id) and mark them, then delete the rows. A failure
anywhere leaves the rows for the next call, which admits nothing twice (an id that
exists is left as it is); a floor that refuses fails the batch before its admit.

On PostgreSQL, :class:`Listener` holds a dedicated ``LISTEN emq_outbox`` connection and
pokes the queue's scheduler thread at each commit's NOTIFY; while it is lost (it
reconnects with a growing pause) the relay runs each beat, as it always does on SQLite.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import redis
from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import SQLAlchemyError

from echomq import durable, scripts
from echomq.admit import AdmitPlanner
from echomq.config import QueueSettings
from echomq.errors import FloorError
from echomq.floor.engine import WRITE_OPTION
from echomq.floor.forkgate import GATE
from echomq.floor.schema import outbox
from echomq.outbox import CHANNEL
from echomq.tracing import producer_span

log = logging.getLogger("echomq.relay")
RELAY_BATCH = 500


class Relay:
    """Admits one queue's committed outbox rows."""

    def __init__(self, queue: str, client: redis.Redis, engine: Engine) -> None:
        self.queue = queue
        self.client = client
        self.engine = engine
        self.planner = AdmitPlanner(queue, QueueSettings())
        self.relayed = 0
        self.error = ""

    def run(self, floor: Any = None, durable_dial: bool = False) -> int:
        """Relay batches until the queue's outbox is empty (or a batch fails: logged, the
        rows stay for the next call). Returns the jobs relayed."""
        total = 0
        while True:
            try:
                n = self._batch(floor if durable_dial else None)
            except (SQLAlchemyError, FloorError, redis.RedisError, OSError) as exc:
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
        stmt = (select(outbox.c.id, outbox.c.job_id, outbox.c.spec)
                .where(outbox.c.queue == self.queue).order_by(outbox.c.id).limit(RELAY_BATCH))
        if self.engine.dialect.name == "postgresql":
            stmt = stmt.with_for_update(skip_locked=True)
        # SQLite: inside the fork gate, as the floor's own calls (no fork mid-transaction),
        # and BEGIN IMMEDIATE: the write lock is taken before the admit, so a lock held by
        # the application fails the batch before it admits anything, never at its DELETE
        sqlite = self.engine.dialect.name == "sqlite"
        gate = GATE.inside() if sqlite else nullcontext()
        engine = self.engine.execution_options(**{WRITE_OPTION: True}) if sqlite else self.engine
        with gate, engine.begin() as conn:
            rows = conn.execute(stmt).all()
            if not rows:
                return 0
            specs = []
            for _, job_id, text in rows:
                spec = json.loads(text)
                specs.append((job_id, spec["args"], spec["due"]))
            # a PRODUCER span of its own ("relay", the count): each job keeps the context
            # of the add that wrote it, so its CONSUMER span links to that add's span
            with producer_span(self.queue, "relay", len(specs)):
                if floor is not None:  # the rows first: a floor that refuses admits nothing
                    # the floor in the same SQLite file: written in this transaction, which
                    # holds that file's write lock (another connection would wait for it)
                    same = conn if sqlite and _same_file(floor.engine, self.engine) else None
                    durable.write_before_admit(floor, self.planner.keys, specs, same)
                scripts.execute(self.client, self.planner.calls(specs))
                if floor is not None:
                    durable.mark(self.client, self.planner.keys, [s[0] for s in specs])
            conn.execute(delete(outbox).where(outbox.c.id.in_([r[0] for r in rows])))
        # after the rows' delete committed: a result() waiting on them goes on
        durable.ring_relayed(self.client, self.planner.keys, [s[0] for s in specs])
        self.relayed += len(rows)
        return len(rows)


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
