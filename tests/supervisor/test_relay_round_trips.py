"""The outbox relay on PostgreSQL: what a batch costs in round trips to the database, and
a pooled connection the server closed. Real PostgreSQL (its wire protocol counted by a
relay in front of it), real Valkey (its commands seen through a proxy)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.relay import Relay, _relay_engine, close_relay_pools

import echomq
from echomq import scripts
from echomq.floor import Floor
from echomq.floor.engine import make_engine

from .pgwire import PgWire
from .proxy import Command, Link, Proxy, script


@pytest.fixture
def app_url(throwaway_database: object) -> str:
    url = throwaway_database("echomq_relay")  # type: ignore[operator]
    with Floor.from_url(url) as db:  # the outbox table, as `migrate --outbox-url` makes it
        db.upgrade()
    return str(url)


def _through(wire: PgWire, url: str) -> str:
    parsed = sa.make_url(url)
    return parsed.set(port=wire.port, query={**parsed.query, "sslmode": "disable"}) \
        .render_as_string(hide_password=False)


def _psycopg(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql+psycopg").render_as_string(
        hide_password=False)


def _commit_jobs(url: str, q: echomq.Queue, n: int) -> list[str]:
    engine = sa.create_engine(_psycopg(url))
    try:
        with engine.begin() as conn:
            return [q.add("x", {"i": i}, tx=conn) for i in range(n)]
    finally:
        engine.dispose()


class AdmitSeen:
    """Notes the database round trips made when each admit reaches the server."""

    def __init__(self, wire: PgWire) -> None:
        self.wire = wire
        self.at: list[int] = []
        self.match = scripts.ADMIT.sha.encode()

    def command(self, link: Link, cmd: Command) -> None:
        if len(cmd) > 1 and cmd[0].upper() == b"EVALSHA" and cmd[1].lower() == self.match:
            self.at.append(self.wire.round_trips)

    def reply(self, *a: object) -> None:
        pass

    def cut(self, *a: object) -> None:
        pass


def test_a_batch_is_one_round_trip_before_its_admit_and_one_after(
        app_url: str, private_redis: LocalRedis) -> None:
    """BEGIN travels with the SELECT and COMMIT with the DELETE, on a pooled connection
    that no pre-ping tests: one round trip from the relay's start to its admit, two in
    all (five before: pre-ping, BEGIN, SELECT, DELETE, COMMIT); an empty outbox costs
    two (BEGIN with the SELECT, then COMMIT)."""
    pg_port = sa.make_url(app_url).port or 5432
    with PgWire(pg_port) as wire:
        seen = AdmitSeen(wire)
        with Proxy(private_redis.port, observer=seen) as proxy:
            client = redis.Redis.from_url(proxy.url)
            q = echomq.Queue("rtq", redis=client)
            relay = Relay("rtq", client, make_engine(_through(wire, app_url)))
            try:
                assert relay.run() == 0  # connects (its startup is not a batch)
                before = wire.round_trips
                assert relay.run() == 0
                assert wire.round_trips - before == 2
                ids = _commit_jobs(app_url, q, 3)
                before = wire.round_trips
                assert relay.run() == 3
                assert wire.round_trips - before == 2
                # every admit sent (a NOSCRIPT reply's load and retry included) after one
                assert seen.at and {at - before for at in seen.at} == {1}
                assert [j.id for j in q.jobs("waiting")] == ids
                assert wire.statements[-1].startswith(b"DELETE") and \
                    wire.statements[-1].rstrip(b"; \n").endswith(b"COMMIT")
            finally:
                close_relay_pools()


@pytest.mark.parametrize("pooled", [1, 3])
def test_every_pooled_connection_the_server_closed_costs_no_batch(
        app_url: str, private_redis: LocalRedis, caplog: pytest.LogCaptureFixture,
        pooled: int) -> None:
    """No pre-ping tests the relay's pooled connections: when the server has closed them
    (a restart, an idle timeout, pg_terminate_backend), the batch runs again at once on
    a new connection, relaying its rows in the same call, with nothing logged; with
    several in the pool (relays of several queues at once), all of them went."""
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("rtk", redis=client)
    relay = Relay("rtk", client, make_engine(app_url))
    admin = sa.create_engine(_psycopg(app_url),
                             isolation_level="AUTOCOMMIT")
    try:
        assert relay.run() == 0
        pool = _relay_engine(relay.engine)
        held = [pool.connect() for _ in range(pooled)]  # the pool's connections, then
        for conn in held:
            conn.close()  # back in the pool, each alive
        with admin.connect() as conn:
            killed = conn.scalar(sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        assert killed >= pooled
        ids = _commit_jobs(app_url, q, 2)
        with caplog.at_level(logging.WARNING, logger="echomq.relay"):
            assert relay.run() == 2
        assert relay.error == "" and not caplog.records
        assert [j.id for j in q.jobs("waiting")] == ids
    finally:
        admin.dispose()
        close_relay_pools()


def test_a_batch_that_fails_after_its_select_leaves_its_rows_unlocked(
        app_url: str, private_redis: LocalRedis) -> None:
    """Valkey down between the SELECT and the admit: the batch fails and its connection
    is closed, so the rows it locked FOR UPDATE are free at once (another relay, or this
    one, takes them), and nothing was admitted."""
    server = private_redis
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("rtf", redis=client)
    relay = Relay("rtf", client, make_engine(app_url))
    try:
        ids = _commit_jobs(app_url, q, 2)
        server.kill()
        assert relay.run() == 0 and relay.error
        check = sa.create_engine(_psycopg(app_url))
        with check.begin() as conn:  # the rows are not locked by the failed batch
            free = conn.execute(sa.text(
                "SELECT job_id FROM emq_outbox ORDER BY id FOR UPDATE NOWAIT")).scalars().all()
        check.dispose()
        assert free == ids
        server.start()
        assert relay.run() == 2
        assert [j.id for j in q.jobs("waiting")] == ids
    finally:
        close_relay_pools()


def test_a_batch_holds_its_rows_locked_until_its_commit(
        app_url: str, private_redis: LocalRedis) -> None:
    """While a batch's admit is on its way (held at the proxy), the rows it read are
    locked: another relay's SELECT ... SKIP LOCKED (a new leader's, during a handover)
    finds none of them, and takes nothing twice. The autocommit connection's BEGIN is
    what keeps the lock past the SELECT."""
    with Proxy(private_redis.port) as proxy:
        client = redis.Redis.from_url(proxy.url)
        q = echomq.Queue("rtl", redis=client)
        scripts.ADMIT.load(client)
        relay = Relay("rtl", client, make_engine(app_url))
        ids = _commit_jobs(app_url, q, 2)
        held = proxy.hold(script(scripts.ADMIT))
        done: list[int] = []
        worker = threading.Thread(target=lambda: done.append(relay.run()), daemon=True)
        worker.start()
        try:
            assert held.wait_held(1, 10)
            other = Relay("rtl", redis.Redis.from_url(private_redis.url),
                          make_engine(app_url))
            assert other.run() == 0  # the rows are the first batch's
            held.let_go()
            worker.join(10)
            assert done == [2]
            assert [j.id for j in q.jobs("waiting")] == ids
        finally:
            held.let_go()
            close_relay_pools()


def test_an_outbox_on_psycopg2_is_relayed(app_url: str, private_redis: LocalRedis) -> None:
    """An outbox URL naming psycopg2 (an application on psycopg 2 alone) is relayed
    through SQLAlchemy's path: its rows admitted in order and deleted."""
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("rtp", redis=client)
    url = sa.make_url(app_url).set(drivername="postgresql+psycopg2")
    relay = Relay("rtp", client, make_engine(url.render_as_string(hide_password=False)))
    assert relay.engine.driver == "psycopg2"
    ids = _commit_jobs(app_url, q, 2)
    assert relay.run() == 2 and relay.error == ""
    assert [j.id for j in q.jobs("waiting")] == ids
    assert relay.run() == 0


def test_a_failed_batch_closes_its_connection(app_url: str, private_redis: LocalRedis
                                             ) -> None:
    """A batch that fails after its SELECT leaves no connection in the pool with the
    transaction's state: it is closed (its backend gone), and the next batch opens
    another."""
    client = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue("rtc", redis=client)
    relay = Relay("rtc", client, make_engine(app_url))
    admin = sa.create_engine(_psycopg(app_url),
                             isolation_level="AUTOCOMMIT")
    try:
        assert relay.run() == 0
        with admin.connect() as conn:
            before = set(conn.scalars(sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")))
        _commit_jobs(app_url, q, 1)
        private_redis.kill()
        assert relay.run() == 0 and relay.error
        # a closed connection's backend leaves pg_stat_activity a moment after the close
        # (no event tells it): its pid is looked for until it is gone, 10 s at most
        deadline = time.monotonic() + 10
        pause = threading.Event()
        while True:
            with admin.connect() as conn:
                after = set(conn.scalars(sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()")))
            if not before & after or time.monotonic() > deadline:
                break
            pause.wait(0.05)
        assert before and not before & after
    finally:
        admin.dispose()
        close_relay_pools()
