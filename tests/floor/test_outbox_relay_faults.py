"""The outbox relay under faults a reliability review found: an application's SQLite
write transaction held across the relay's admit, and a LISTEN thread whose poke fails.
Real SQLite files, real PostgreSQL, real Valkey; the lock is held by a real connection."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.relay import Listener, Relay

import echomq
from echomq.floor import Floor
from echomq.floor.engine import make_engine


def test_sqlite_relay_blocked_by_an_app_write_transaction_admits_nothing(
        floor: Floor, floor_url: str, server: LocalRedis) -> None:
    """The app holds a write transaction on the outbox's SQLite file while the relay runs:
    the relay must fail before its admit, not after it (its DELETE refused), or each
    beat admits the rows again and a job whose hash retention dropped runs once more."""
    if not floor_url.startswith("sqlite"):
        pytest.skip("SQLite's database-wide write lock")
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obl", redis=client, keep_completed=0)  # a completed hash goes at once
    with floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    relay = Relay("obl", client, make_engine(floor_url, busy_timeout_ms=200))
    ran: list[str] = []
    app = sqlite3.connect(sa.make_url(floor_url).database, isolation_level=None)
    app.execute("BEGIN IMMEDIATE")  # the application's open write transaction
    try:
        assert relay.run() == 0  # refused: "database is locked"
        assert q.get(jid) is None  # and nothing was admitted meanwhile
        echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    finally:
        app.rollback()
        app.close()
    assert relay.run() == 1  # the lock gone, the row is relayed once
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == [jid]


def test_listener_survives_a_poke_that_fails(pg_floor: Floor) -> None:
    """A poke that raises (the supervisor's map of scheduler threads changing under the
    first poke, at startup) must not end the LISTEN thread: the next NOTIFY still pokes."""
    poked, failed = threading.Event(), threading.Event()

    def poke(queue: str) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("dictionary changed size during iteration")
        if queue == "obn":
            poked.set()

    listener = Listener(pg_floor.engine, poke)
    listener.start()
    try:
        assert failed.wait(30)  # the poke at connect raised
        with pg_floor.engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_notify('emq_outbox', 'obn')"))
        assert poked.wait(30), "the LISTEN thread died with the failed poke"
    finally:
        listener.close()


def test_durable_add_refused_by_the_floor_reaches_it_by_the_fold(
        floor: Floor, floor_url: str, server: LocalRedis) -> None:
    """A durable add whose floor commit fails raises, but its job is admitted and runs:
    its row must still reach the floor (the scheduler's fold, once the floor takes
    writes), or a later Valkey loss loses a job that is running in the queue."""
    if not floor_url.startswith("sqlite"):
        pytest.skip("SQLite's database-wide write lock")
    from echomq.supervisor.scheduler import Scheduler

    from echomq.errors import FloorError

    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("fe", client, floor, beat_ms=100, horizon_s=3600)
    scheduler.tick(0.0)  # leads: the queue folds
    producer = Floor.from_url(floor_url, busy_timeout_ms=200)
    q = echomq.Queue("fe", redis=client, floor=producer, durability="durable")
    app = sqlite3.connect(sa.make_url(floor_url).database, isolation_level=None)
    app.execute("BEGIN IMMEDIATE")  # another writer holds the floor's file
    try:
        with pytest.raises(FloorError):
            q.add("x", {"i": 1}, job_id="refused")
    finally:
        app.rollback()
        app.close()
    assert q.get("refused") is not None  # admitted all the same
    scheduler.next_tick = 0.0
    scheduler.floor_retry_at = 0.0
    scheduler.tick(1.0)
    assert [r.job_id for r in floor.open_rows("fe", None, 10)] == ["refused"]
    producer.dispose()


def test_durable_relay_with_the_floor_refusing_admits_nothing(
        floor: Floor, floor_url: str, server: LocalRedis, tmp_path: object) -> None:
    """The outbox in the application's database, the floor refusing writes (another writer
    holds its SQLite file): the relay must not admit, or each beat admits the rows again
    (its transaction rolled back) and a job whose completed hash was dropped runs again."""
    if not floor_url.startswith("sqlite"):
        pytest.skip("SQLite's database-wide write lock")
    from echomq.supervisor.cli import main as cli_main

    app_url = f"sqlite:///{tmp_path}/app.db"
    assert cli_main(["migrate", "--floor-url", app_url]) == 0
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("frl", redis=client, keep_completed=0)
    app_engine = make_engine(app_url)
    with app_engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    relay = Relay("frl", client, app_engine)
    refusing = Floor.from_url(floor_url, busy_timeout_ms=200)
    ran: list[str] = []
    holder = sqlite3.connect(sa.make_url(floor_url).database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the floor takes no writes
    try:
        assert relay.run(refusing, durable_dial=True) == 0
        assert q.get(jid) is None  # not admitted: its floor row comes first
        echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    finally:
        holder.rollback()
        holder.close()
    assert relay.run(refusing, durable_dial=True) == 1
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == [jid]
    assert [r.job_id for r in floor.open_rows("frl", None, 10)] in ([jid], [])
    refusing.dispose()


def test_the_outbox_is_relayed_while_the_floor_is_down(
        floor: Floor, floor_url: str, server: LocalRedis, tmp_path: object) -> None:
    """The outbox in the application's database, a "folded" queue whose floor refuses
    writes: the relay needs no floor, so committed jobs are still admitted each beat."""
    if not floor_url.startswith("sqlite"):
        pytest.skip("SQLite's database-wide write lock")
    from echomq.supervisor.cli import main as cli_main
    from echomq.supervisor.scheduler import Scheduler

    app_url = f"sqlite:///{tmp_path}/app.db"
    assert cli_main(["migrate", "--floor-url", app_url]) == 0
    client = redis.Redis.from_url(server.url)
    refusing = Floor.from_url(floor_url, busy_timeout_ms=200)
    scheduler = Scheduler("fdown", client, refusing, beat_ms=100, horizon_s=3600)
    app_engine = make_engine(app_url)
    scheduler.relay = Relay("fdown", client, app_engine)
    scheduler.tick(0.0)  # leads: the queue folds
    q = echomq.Queue("fdown", redis=client)
    q.add("later", {}, delay=600)  # a fold the floor must take
    with app_engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    holder = sqlite3.connect(sa.make_url(floor_url).database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the floor takes no writes
    try:
        scheduler.next_tick = scheduler.floor_retry_at = 0.0
        scheduler.tick(1.0)
        assert not scheduler.floor_ok  # the floor is down for this beat
        assert q.get(jid) is not None, "the outbox waited for the floor"
    finally:
        holder.rollback()
        holder.close()
    refusing.dispose()


def test_durable_add_of_a_deduplicated_id_writes_no_row(floor: Floor, server: LocalRedis
                                                        ) -> None:
    """add(job_id=...) again while the id's dedup reservation outlives its dropped hash
    admits nothing: it must not open a floor row either (a row for no job, which a Valkey
    loss would bring back as a job the deduplication refused)."""
    from echomq.supervisor.scheduler import Scheduler

    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("dd", client, floor, beat_ms=100, horizon_s=3600)
    scheduler.tick(0.0)  # leads: the queue folds, closed rows are dropped each beat
    q = echomq.Queue("dd", redis=client, floor=floor, durability="durable", keep_completed=0)
    q.add("x", {}, job_id="once", dedup_s=600)
    echomq.Consumer(q, lambda job: None).run(burst=True)
    scheduler.next_tick = 0.0
    scheduler.tick(1.0)
    assert q.get("once") is None and floor.open_rows("dd", None, 10) == []
    assert q.add("x", {}, job_id="once", dedup_s=600) == "once"  # deduplicated
    assert q.get("once") is None
    assert floor.open_rows("dd", None, 10) == []
