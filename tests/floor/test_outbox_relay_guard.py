"""The outbox relay's guard (lua/relayguard.lua): a batch read again after its delete
failed admits none of its rows twice, while a later row of the same job id is a new add.
Real SQLite files, real PostgreSQL, a real Valkey; a relay killed is a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.relay import Relay
from echomq.supervisor.scheduler import Scheduler

import echomq
from echomq import durable
from echomq.floor import Floor

_REFUSE_DELETE = {
    "sqlite": ["CREATE TRIGGER emq_refuse BEFORE DELETE ON emq_outbox "
               "BEGIN SELECT RAISE(ABORT, 'the commit is lost'); END"],
    "postgresql": [
        "CREATE FUNCTION emq_refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'the commit is lost'; END $$",
        "CREATE TRIGGER emq_refuse BEFORE DELETE ON emq_outbox "
        "FOR EACH ROW EXECUTE FUNCTION emq_refuse()"],
}
_HOLD_DELETE = [  # PostgreSQL: the relay's DELETE waits, its admit done
    "CREATE FUNCTION emq_hold() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN PERFORM pg_sleep(600); RETURN OLD; END $$",
    "CREATE TRIGGER emq_hold BEFORE DELETE ON emq_outbox "
    "FOR EACH ROW EXECUTE FUNCTION emq_hold()"]


def _backend(floor_url: str) -> str:
    return "sqlite" if floor_url.startswith("sqlite") else "postgresql"


def _drop_trigger(floor: Floor, name: str) -> None:
    on = " ON emq_outbox" if floor.engine.dialect.name == "postgresql" else ""
    with floor.engine.begin() as conn:
        conn.execute(sa.text(f"DROP TRIGGER {name}{on}"))


def _run_until(consumer: echomq.Consumer, ran: list[str], count: int) -> None:
    """Burst until ``count`` jobs ran (a burst promotes what is due first: a deferred job
    runs in the burst after it is due)."""
    deadline = time.monotonic() + 10
    while len(ran) < count:
        assert time.monotonic() < deadline, f"only {len(ran)} of {count} job(s) ran"
        consumer.run(burst=True)


def _guard_ttls(client: redis.Redis, queue: str, job_id: str) -> list[int]:
    return [client.pttl(k) for k in client.scan_iter(f"emq:{{{queue}}}:relayed:{job_id}:*")]


@pytest.mark.parametrize("delayed", [False, True], ids=["now", "deferred"])
def test_a_relay_whose_delete_fails_after_its_admit_runs_no_job_twice(
        floor: Floor, floor_url: str, server: LocalRedis, delayed: bool) -> None:
    """The relay admits a batch, then its DELETE fails: the rows stay and the next relay
    reads them again. A job that completed meanwhile, its hash dropped at once by its
    retention (keep_completed=0), must not be admitted and run a second time."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obg", redis=client, keep_completed=0)
    with floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn, delay=0.05 if delayed else None)
    with floor.engine.begin() as conn:
        for sql in _REFUSE_DELETE[_backend(floor_url)]:
            conn.execute(sa.text(sql))
    relay = Relay("obg", client, floor.engine)
    assert relay.run() == 0 and "the commit is lost" in relay.error  # admitted, row kept
    # the guard is held a day, not a minute: the database may come back much later
    [ttl] = _guard_ttls(client, "obg", jid)
    assert ttl > 3600_000
    ran: list[str] = []
    consumer = echomq.Consumer(q, lambda job: ran.append(job.id))
    _run_until(consumer, ran, 1)
    assert q.get(jid) is None  # retention dropped the completed job's hash
    _drop_trigger(floor, "emq_refuse")
    assert relay.run() == 1  # the row is read again and deleted
    with floor.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM emq_outbox")).scalar() == 0
    consumer.run(burst=True)
    assert ran == [jid]
    # its delete committed: the guard goes back to the minute a result() waiter needs
    [ttl] = _guard_ttls(client, "obg", jid)
    assert 0 < ttl <= 60_000


def test_an_outbox_job_added_again_after_it_finished_runs_again(
        floor: Floor, server: LocalRedis) -> None:
    """The same job id written to the outbox again once its first run finished and its
    hash was dropped is a new add: relayed and run, and its result() waits for the
    relay rather than taking the first row's doorbell for its own."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("oba", redis=client, keep_completed=0)
    relay = Relay("oba", client, floor.engine)
    ran: list[str] = []
    consumer = echomq.Consumer(q, lambda job: ran.append(job.id))
    for n in (1, 2):
        with floor.engine.begin() as conn:
            assert q.add("x", {}, job_id="same", tx=conn) == "same"
        if n == 2:  # not relayed yet: result() waits for the relay of this add
            with pytest.raises(TimeoutError, match="not relayed"):
                q.result("same", timeout=0.3)
        assert relay.run() == 1
        _run_until(consumer, ran, n)
        assert q.get("same") is None
    assert ran == ["same", "same"]


def test_an_outbox_job_added_twice_while_it_waits_is_admitted_once(
        floor: Floor, server: LocalRedis) -> None:
    """Two rows of one job id relayed while the first is still waiting: the id is taken,
    so the second add is a no-op, as a second q.add of a waiting id is."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obt", redis=client)
    with floor.engine.begin() as conn:
        q.add("x", {"n": 1}, job_id="twice", tx=conn)
        q.add("x", {"n": 2}, job_id="twice", tx=conn)
    assert Relay("obt", client, floor.engine).run() == 2
    ran: list[object] = []
    echomq.Consumer(q, lambda job: ran.append(job.payload)).run(burst=True)
    assert ran == [{"n": 1}]


def test_a_relay_killed_between_its_admit_and_its_delete_runs_no_job_twice(
        pg_floor: Floor, pg_url: str, server: LocalRedis) -> None:
    """A relay process killed while its DELETE runs, after its admit: nothing of it
    extends the guard, so the admit itself must write the guard to last until the rows'
    delete commits, however late the next relay reads them again."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obk", redis=client, keep_completed=0)
    with pg_floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
        for sql in _HOLD_DELETE:
            conn.execute(sa.text(sql))
    code = ("import redis, sys\n"
            "from echomq.supervisor.relay import Relay\n"
            "from echomq.floor.engine import make_engine\n"
            "Relay('obk', redis.Redis.from_url(sys.argv[1]), make_engine(sys.argv[2])).run()\n")
    relay = subprocess.Popen([sys.executable, "-c", code, server.url, pg_url],
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    held = ("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
            "AND datname = current_database()")
    try:
        deadline = time.monotonic() + 30
        with pg_floor.engine.connect() as conn:
            while not conn.execute(sa.text(held)).all():  # the DELETE waits, admit done
                assert time.monotonic() < deadline, "the relay's DELETE never began"
                assert relay.poll() is None, "the relay ended"
                conn.rollback()  # a transaction reads one snapshot of pg_stat_activity
                time.sleep(0.05)  # pg_stat_activity has no event to wait on
            assert q.get(jid) is not None
            relay.send_signal(signal.SIGKILL)
            relay.wait(10)
            conn.execute(sa.text(f"SELECT pg_terminate_backend(pid) FROM ({held}) AS h"))
            conn.commit()
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait(10)
    [ttl] = _guard_ttls(client, "obk", jid)
    assert ttl > 3600_000
    ran: list[str] = []
    consumer = echomq.Consumer(q, lambda job: ran.append(job.id))
    _run_until(consumer, ran, 1)
    assert q.get(jid) is None  # completed and dropped before the rows are read again
    _drop_trigger(pg_floor, "emq_hold")
    assert Relay("obk", client, pg_floor.engine).run() == 1
    consumer.run(burst=True)
    assert ran == [jid]


@pytest.mark.parametrize("keep", [0, None], ids=["dropped", "kept"])
def test_durable_relay_reading_a_failed_batch_again_leaves_no_row_of_a_finished_job(
        floor: Floor, floor_url: str, server: LocalRedis, keep: int | None) -> None:
    """Under "durable" the relay writes a batch's floor rows before its admit. A batch
    read again after its delete failed must not write the row of a job that finished
    meanwhile (its row closed), whether retention dropped its hash or keeps it: an open
    row of a finished job is run again when Valkey loses its data."""
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("obd", client, floor, beat_ms=100, horizon_s=3600)
    scheduler.tick(0.0)  # leads
    q = echomq.Queue("obd", redis=client, **({} if keep is None else {"keep_completed": keep}))
    with floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
        for sql in _REFUSE_DELETE[_backend(floor_url)]:
            conn.execute(sa.text(sql))
    relay = Relay("obd", client, floor.engine)
    assert relay.run(floor, durable_dial=True) == 0 and "the commit is lost" in relay.error
    # on PostgreSQL its floor row committed on its own; a SQLite floor in the outbox's file
    # was written in the relay's transaction, rolled back with it
    assert [r.job_id for r in floor.open_rows("obd", None, 10)] == (
        [jid] if _backend(floor_url) == "postgresql" else [])
    ran: list[str] = []
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == [jid]
    scheduler.next_tick = 0.0
    scheduler.tick(1.0)  # the completion closes its row
    assert floor.open_rows("obd", None, 10) == []
    _drop_trigger(floor, "emq_refuse")
    assert relay.run(floor, durable_dial=True) == 1
    assert floor.open_rows("obd", None, 10) == []
    with floor.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM emq_outbox")).scalar() == 0
    client.flushall()  # Valkey loses its data: the floor brings back nothing to run again
    for t in (2.0, 3.0, 4.0):
        scheduler.next_tick = 0.0
        scheduler.tick(t)
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == [jid]


def test_durable_relay_reading_a_failed_batch_again_writes_the_row_of_a_waiting_job(
        floor: Floor, floor_url: str, server: LocalRedis) -> None:
    """A batch read again after its delete failed, its job still waiting: the job's floor
    row is written (a SQLite floor in the outbox's file lost the first write with the
    failed transaction), so a Valkey loss now loses nothing."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obw", redis=client)
    with floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
        for sql in _REFUSE_DELETE[_backend(floor_url)]:
            conn.execute(sa.text(sql))
    relay = Relay("obw", client, floor.engine)
    assert relay.run(floor, durable_dial=True) == 0 and "the commit is lost" in relay.error
    _drop_trigger(floor, "emq_refuse")
    assert relay.run(floor, durable_dial=True) == 1
    assert [r.job_id for r in floor.open_rows("obw", None, 10)] == [jid]
    assert q.counts()["waiting"] == 1  # admitted once


@contextmanager
def _paused_after_its_read(queue: str, client: redis.Redis, engine: Any) -> Iterator[Relay]:
    """Relay A of leader "a|1" running in a thread, its process stalled between its read
    of the outbox and its admit until the block ends; then it goes on and is joined."""
    read, resume = threading.Event(), threading.Event()

    class Paused(Relay):
        def _admit(self, rows: Any, floor: Any, same: Any) -> Any:
            read.set()
            resume.wait(30)  # the process stalls here
            return super()._admit(rows, floor, same)

    relay = Paused(queue, client, engine)
    thread = threading.Thread(target=relay.run, kwargs={"leader": "a|1"})
    thread.start()
    try:
        assert read.wait(10)
        yield relay
    finally:
        resume.set()
        thread.join(30)


def test_a_relay_paused_after_its_read_admits_nothing_once_another_leader_relayed_the_rows(
        pg_floor: Floor, server: LocalRedis) -> None:
    """Relay A reads the rows, then its process stalls; the server ends its session (the
    row locks go), another leader's relay B admits the rows, deletes them and cuts their
    guards short, and the job runs and is dropped. A's admit, when it resumes, is refused
    (its leader lease is another's): the job does not run twice."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obp", redis=client, keep_completed=0)
    with pg_floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    client.set(q.keys.leader, "a|1")
    with _paused_after_its_read("obp", client, pg_floor.engine) as a:
        with pg_floor.engine.begin() as conn:  # the server ends A's idle transaction
            conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE state = "
                "'idle in transaction' AND query LIKE '%emq_outbox%' "
                "AND pid <> pg_backend_pid() AND datname = current_database()"))
        client.set(q.keys.leader, "b|2")  # B's scheduler leads now
        assert Relay("obp", client, pg_floor.engine).run(leader="b|2") == 1
        ran: list[str] = []
        echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
        assert ran == [jid] and q.get(jid) is None
        for key in client.scan_iter(f"emq:{{obp}}:relayed:{jid}:*"):
            client.delete(key)  # the minute of the guard B cut short has passed
    assert "NOTLEADER" in a.error
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == [jid]
    q.close()


def test_a_leader_s_relay_admits_and_a_deposed_one_s_admits_nothing(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    scheduler = Scheduler("obl", client, floor, beat_ms=100, horizon_s=3600)
    scheduler.relay = Relay("obl", client, floor.engine)
    q = echomq.Queue("obl", redis=client)
    with floor.engine.begin() as conn:
        first = q.add("x", {}, tx=conn)
    scheduler.tick(0.0)  # leads, and relays under its lease
    assert scheduler.fence is not None and q.get(first) is not None
    with floor.engine.begin() as conn:
        second = q.add("x", {}, tx=conn)
    client.set(q.keys.leader, "another|" + str(scheduler.fence + 1))
    assert scheduler.relay.run(leader=f"{scheduler.replica}|{scheduler.fence}") == 0
    assert "NOTLEADER" in scheduler.relay.error and q.get(second) is None
    with floor.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM emq_outbox")).scalar() == 1


def _result_in_thread(q: echomq.Queue, job_id: str, client: redis.Redis
                      ) -> tuple[Any, dict[str, Any]]:
    """q.result(job_id) in a thread, returned once it blocks waiting for the relay."""
    out: dict[str, Any] = {}

    def wait() -> None:
        try:
            out["value"] = q.result(job_id, timeout=20)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out["error"] = exc

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 10
    while not any(c.get("cmd") == "blmove" for c in client.client_list()):
        assert time.monotonic() < deadline, "result() never waited for the relay"
        time.sleep(0.01)
    return thread, out


def test_result_of_an_id_outboxed_on_two_queues_waits_for_its_own_queue_s_row(
        floor: Floor, server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    emails = echomq.Queue("obe", redis=client)
    invoices = echomq.Queue("obi", redis=client)
    with floor.engine.begin() as conn:
        emails.add("x", {}, job_id="order-7", tx=conn)
        invoices.add("x", {}, job_id="order-7", tx=conn)
    thread, out = _result_in_thread(emails, "order-7", client)
    assert Relay("obe", client, floor.engine).run() == 1
    echomq.Consumer(emails, lambda job: 42).run(burst=True)
    thread.join(30)
    assert out == {"value": 42}


def test_result_of_an_id_whose_later_add_rolled_back_wakes_at_the_earlier_one_s_relay(
        floor: Floor, server: LocalRedis) -> None:
    """The id is added again (idempotent) in a transaction that rolls back: the row
    waited on never comes, and result() finds the job the relay admitted from the first
    add between two slices of its wait."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obr", redis=client)
    with floor.engine.begin() as conn:
        q.add("x", {}, job_id="order-1", tx=conn)
    with floor.engine.connect() as conn:
        tx = conn.begin()
        q.add("x", {}, job_id="order-1", tx=conn)
        tx.rollback()
    thread, out = _result_in_thread(q, "order-1", client)
    assert Relay("obr", client, floor.engine).run() == 1
    echomq.Consumer(q, lambda job: 42).run(burst=True)
    thread.join(30)
    assert out == {"value": 42}


def test_result_of_an_outbox_job_another_thread_waited_for_already_returns_it(
        floor: Floor, server: LocalRedis) -> None:
    """Two result() calls of one outbox job in one process: the first to see the relay's
    admit forgets the row's token; the other, checking the job right then, still waits
    on the row's doorbell, which rang (it raised KeyError)."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obk", redis=client)
    with floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    checked, go = threading.Event(), threading.Event()

    class Held(redis.Redis):
        """A client whose job check answers "not yet", then waits for the test."""

        def exists(self, *names: Any) -> int:
            super().exists(*names)
            checked.set()
            go.wait(10)
            return 0

    out: dict[str, Any] = {}

    def first() -> None:
        try:
            out["left"] = durable.await_relay(Held.from_url(server.url), q.keys, "obk", jid, 5)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out["error"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    assert checked.wait(10)
    Relay("obk", client, floor.engine).run()
    echomq.Consumer(q, lambda job: 1).run(burst=True)
    assert q.result(jid, timeout=5) == 1  # forgets the token
    go.set()
    thread.join(10)
    assert "error" not in out and 0 < out["left"] <= 5  # the row's doorbell rang


def test_a_deposed_relay_under_durable_writes_no_floor_row(floor: Floor, server: LocalRedis
                                                           ) -> None:
    """Under "durable" the floor rows go first: a relay whose lease is another's writes
    none (an open row of a job another leader relayed would come back after a wipe)."""
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obf", redis=client)
    with floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    client.set(q.keys.leader, "another|2")
    relay = Relay("obf", client, floor.engine)
    assert relay.run(floor, durable_dial=True, leader="me|1") == 0
    assert "NOTLEADER" in relay.error and q.get(jid) is None
    assert floor.open_rows("obf", None, 10) == []


def test_a_relay_stopped_inside_its_transaction_frees_its_rows_for_the_next_leader(
        pg_floor: Floor, server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relay A stops (a frozen process) between its read and its commit, its rows locked:
    the server ends its idle session after the relay's bound, so the next leader's relay
    takes the rows instead of skipping them for as long as A is stopped."""
    from echomq.supervisor import relay as relay_mod

    monkeypatch.setattr(relay_mod, "RELAY_IDLE_IN_TX_MS", 300)
    relay_mod.close_relay_pools()  # made again with that bound
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obs", redis=client, keep_completed=0)
    with pg_floor.engine.begin() as conn:
        jid = q.add("x", {}, tx=conn)
    client.set(q.keys.leader, "a|1")
    try:
        with _paused_after_its_read("obs", client, pg_floor.engine) as a:
            client.set(q.keys.leader, "b|2")
            b = Relay("obs", client, pg_floor.engine)
            deadline = time.monotonic() + 10
            while b.run(leader="b|2") == 0:  # skipped while A's row lock holds
                assert time.monotonic() < deadline, "the stopped relay's rows stayed locked"
                time.sleep(0.05)
            ran: list[str] = []
            echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
            assert ran == [jid]
    finally:
        relay_mod.close_relay_pools()
    assert "NOTLEADER" in a.error
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert ran == [jid]
    q.close()
