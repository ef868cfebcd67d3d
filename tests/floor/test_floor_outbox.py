"""The transactional outbox: tx= writes the job in the caller's transaction; the leader
scheduler relays committed rows (idempotent on the id); rollback means no job; on
PostgreSQL a NOTIFY at commit wakes the relay; bad input writes nothing."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.relay import Listener, Relay
from echomq.supervisor.scheduler import Scheduler
from sqlalchemy.orm import Session

import echomq
import echomq.aio
from echomq.errors import OutboxError
from echomq.floor import Floor

orders = sa.Table("orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))


def _relaying(client: redis.Redis, floor: Floor, queue: str) -> Scheduler:
    s = Scheduler(queue, client, floor, beat_ms=100, horizon_s=3600)
    s.relay = Relay(queue, client, floor.engine)
    return s


def _outbox_rows(floor: Floor) -> int:
    with floor.engine.connect() as conn:
        return int(conn.scalar(sa.text("SELECT count(*) FROM emq_outbox")) or 0)


def test_committed_jobs_are_relayed_and_rolled_back_ones_never_exist(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("ob", redis=client)
    orders.create(floor.engine)
    with floor.engine.begin() as conn:
        conn.execute(orders.insert().values(id=1))
        kept = q.add("ship", {"order": 1}, tx=conn)
        many = q.add_many([("ship", {"order": i}) for i in range(2, 5)], tx=conn)
    with pytest.raises(RuntimeError), floor.engine.begin() as conn:
        lost = q.add("ship", {"order": 9}, tx=conn)
        raise RuntimeError("the application rolls back")
    with Session(floor.engine) as session, session.begin():
        via_session = q.add("ship", {"order": 5}, tx=session)
    assert q.get(kept) is None  # nothing in Valkey before the relay
    sched = _relaying(client, floor, "ob")
    sched.tick(0.0)
    assert [j.id for j in q.jobs("waiting")] == [kept, *many, via_session]
    assert q.get(lost) is None and _outbox_rows(floor) == 0
    # a relay that failed after its admit (the rows still there) admits nothing twice
    with floor.engine.begin() as conn:
        q.add("ship", {}, job_id=kept, tx=conn)
    sched.tick(1.0)
    assert q.counts()["waiting"] == 5 and _outbox_rows(floor) == 0


def test_result_waits_across_the_relay(floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obr", redis=client)
    with floor.engine.begin() as conn:
        jid = q.add("double", {"x": 21}, tx=conn)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(q.result(jid, timeout=30)))
    waiter.start()
    _relaying(client, floor, "obr").tick(0.0)
    echomq.Consumer(q, lambda job: job.payload["x"] * 2).run(burst=True)
    waiter.join(30)
    assert got == [42]


def test_a_durable_queue_puts_relayed_jobs_on_the_floor(floor: Floor, server: LocalRedis
                                                        ) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obd", redis=client)
    with floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    sched = _relaying(client, floor, "obd")
    sched.durable = True
    sched.tick(0.0)
    assert [r.job_id for r in floor.open_rows("obd", None, 10)] == [jid]


def test_aio_add_with_an_async_connection(floor: Floor, server: LocalRedis,
                                          floor_url: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    url = (floor_url.replace("sqlite:", "sqlite+aiosqlite:") if floor_url.startswith("sqlite")
           else floor_url.replace("postgresql:", "postgresql+psycopg:"))

    async def main() -> str:
        engine = create_async_engine(url)
        aq = echomq.aio.Queue("oba", redis_url=server.url)
        async with engine.begin() as conn:
            jid = await aq.add("x", {"a": 1}, tx=conn)
        await aq.close()
        await engine.dispose()
        return jid

    try:
        import aiosqlite  # noqa: F401
    except ImportError:
        if floor_url.startswith("sqlite"):
            pytest.skip("aiosqlite is not installed")
    jid = asyncio.run(main())
    client = redis.Redis.from_url(server.url)
    _relaying(client, floor, "oba").tick(0.0)
    assert echomq.Queue("oba", redis=client).get(jid) is not None


def test_bad_tx_and_a_database_without_the_outbox_write_nothing(
        floor: Floor, server: LocalRedis, tmp_path: object) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obx", redis=client)
    with pytest.raises(OutboxError, match="sqlalchemy.Connection or sqlalchemy.orm.Session"):
        q.add("x", {}, tx=object())
    bare = sa.create_engine(f"sqlite:///{tmp_path}/app.db")
    with bare.begin() as conn, pytest.raises(OutboxError, match="echomq-supervisor migrate"):
        q.add("x", {}, tx=conn)
    assert q.counts()["waiting"] == 0 and _outbox_rows(floor) == 0


def test_notify_at_commit_wakes_the_listener(pg_floor: Floor, server: LocalRedis) -> None:
    poked = threading.Event()
    listener = Listener(pg_floor.engine, lambda queue: queue == "obn" and poked.set())
    listener.start()
    try:
        assert listener.connected.wait(10)
        q = echomq.Queue("obn", redis=redis.Redis.from_url(server.url))
        with pg_floor.engine.begin() as conn:
            q.add("x", {}, tx=conn)
            assert not poked.wait(0.3)  # not before the commit
        assert poked.wait(10)
    finally:
        listener.close()


def test_a_task_sends_through_the_outbox(floor: Floor, server: LocalRedis) -> None:
    @echomq.task(queue="obt", name="obt.ship", redis_url=server.url)
    def ship(order: int) -> int:
        return order

    with pytest.raises(RuntimeError), floor.engine.begin() as conn:
        gone = ship.options(tx=conn).send(1)
        raise RuntimeError("rollback")
    with floor.engine.begin() as conn:
        jid = ship.options(tx=conn, lane="o-7").send(7)
    client = redis.Redis.from_url(server.url)
    _relaying(client, floor, "obt").tick(0.0)
    q = echomq.Queue("obt", redis=client)
    job = q.get(jid)
    assert job is not None and job.name == "obt.ship" and job.lane == "o-7"
    assert q.get(gone) is None


def test_aio_refuses_a_sync_connection(floor: Floor, server: LocalRedis) -> None:
    async def main() -> None:
        aq = echomq.aio.Queue("obs", redis_url=server.url)
        try:
            with floor.engine.begin() as conn:
                await aq.add("x", {}, tx=conn)
        finally:
            await aq.close()

    with pytest.raises(OutboxError, match="AsyncConnection or AsyncSession"):
        asyncio.run(main())
    assert _outbox_rows(floor) == 0


def test_a_lost_listen_connection_reconnects(pg_floor: Floor, server: LocalRedis) -> None:
    poked = threading.Event()
    listener = Listener(pg_floor.engine, lambda queue: queue == "obl" and poked.set())
    listener.start()
    try:
        assert listener.connected.wait(10)
        with pg_floor.engine.connect() as conn:  # the database ends the LISTEN session
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE query LIKE 'LISTEN%' AND datname = current_database()"))
        deadline = time.monotonic() + 20
        while listener.connects < 2:  # no event marks a reconnect from outside the thread
            assert time.monotonic() < deadline, "the listener did not reconnect"
            poked.wait(0.05)
        q = echomq.Queue("obl", redis=redis.Redis.from_url(server.url))
        with pg_floor.engine.begin() as conn:
            q.add("x", {}, tx=conn)
        assert poked.wait(10)
    finally:
        listener.close()


def test_waiting_across_the_relay_outlasts_the_socket_timeout(floor: Floor,
                                                             server: LocalRedis) -> None:
    """A result() wait longer than the client's socket timeout ends in TimeoutError when the
    relay never comes (not in a socket error), and in the result when it does."""
    client = redis.Redis.from_url(server.url, socket_timeout=0.3)
    q = echomq.Queue("obt", redis=client)
    with floor.engine.begin() as conn:
        jid = q.add("double", {"x": 21}, tx=conn)
    with pytest.raises(TimeoutError, match="not relayed"):
        q.result(jid, timeout=1.0)
    _relaying(client, floor, "obt").tick(0.0)
    echomq.Consumer(q, lambda job: job.payload["x"] * 2).run(burst=True)
    assert q.result(jid, timeout=1.0) == 42


ODD = {"s": 'quote " backslash \\ newline \n tab \t é ☃ \u0000 end', "n": [1, 2.5, None]}


def test_a_transaction_s_jobs_are_one_statement_with_its_notify(pg_floor: Floor,
                                                                server: LocalRedis) -> None:
    """100 jobs in a transaction on PostgreSQL: one statement carries every row and the
    NOTIFY (one round trip); payloads that need escaping come out as they went in."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("ob1", redis=client)
    statements: list[str] = []
    with pg_floor.engine.connect() as conn:
        with conn.begin():  # the first write checks the table: not counted
            first = q.add("x", {}, tx=conn)
        sa.event.listen(conn, "before_cursor_execute",
                        lambda c, cur, sql, *a: statements.append(sql))
        with conn.begin():
            ids = q.add_many([("x", {**ODD, "i": i}) for i in range(100)], tx=conn)
    assert len(statements) == 1 and "pg_notify" in statements[0], statements
    _relaying(client, pg_floor, "ob1").tick(0.0)
    assert [j.id for j in q.jobs("waiting", limit=200)] == [first, *ids]
    assert all(q.get(j).payload == {**ODD, "i": i} for i, j in enumerate(ids))
    assert _outbox_rows(pg_floor) == 0


@pytest.mark.parametrize("paramstyle", ["format", "pyformat"])
def test_a_dbapi_cursor_writes_the_same_one_statement(pg_floor: Floor, server: LocalRedis,
                                                      paramstyle: str) -> None:
    """write_cursor (a framework's own connection) on PostgreSQL: one statement with its
    NOTIFY, in either of psycopg's paramstyles; the relay admits the rows in order."""
    from echomq import outbox
    from echomq.admit import AdmitPlanner
    from echomq.config import QueueSettings

    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obc", redis=client)
    specs = AdmitPlanner("obc", QueueSettings()).specs(
        [("x", {**ODD, "i": i}) for i in range(3)])
    raw = pg_floor.engine.raw_connection()
    try:
        cursor = raw.cursor()
        outbox.write_cursor(cursor, "obc", specs, paramstyle=paramstyle, postgresql=True)
        raw.commit()
    finally:
        raw.close()
    _relaying(client, pg_floor, "obc").tick(0.0)
    assert [j.id for j in q.jobs("waiting")] == [s[0] for s in specs]
    assert q.get(specs[2][0]).payload == {**ODD, "i": 2}


def test_the_relay_runs_in_a_producer_span_and_jobs_keep_their_add_s_context(
        floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)  # as if set globally
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obt", redis=client)
    with floor.engine.begin() as conn:
        ids = q.add_many([("ship", {"order": i}) for i in range(3)], tx=conn)
    (add_span,) = exporter.get_finished_spans()
    _relaying(client, floor, "obt").tick(0.0)
    relay_span = exporter.get_finished_spans()[-1]
    assert relay_span.kind == trace.SpanKind.PRODUCER
    assert relay_span.attributes["messaging.operation.name"] == "relay"
    assert relay_span.attributes["messaging.batch.message_count"] == 3
    assert relay_span.attributes["messaging.destination.name"] == "obt"
    ctx = add_span.context
    carried = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert [client.hget(q.keys.job(j), "trace").decode() for j in ids] == [carried] * 3
    provider.shutdown()
