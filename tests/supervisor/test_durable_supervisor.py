"""A real supervisor under the "durable" dial and with the transactional outbox: Valkey
wiped (FLUSHALL) mid-run loses no job; committed outbox rows are relayed, rolled back
ones never run. SQLite and PostgreSQL floors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import LocalRedis

import echomq
from echomq import scripts
from echomq.errors import ConnectionFailed
from echomq.floor import Floor

from .conftest import Supervisor, readyz, wait_until
from .proxy import Proxy, script


@pytest.fixture(params=["sqlite", "postgresql"])
def floor_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'floor.db'}"
    else:
        url = request.getfixturevalue("throwaway_database")("echomq_test")
    with Floor.from_url(url) as floor:
        floor.upgrade()
    return url


def test_a_flushall_mid_run_loses_no_job(private_redis: LocalRedis, redis_url: str,
                                         queue_name: str, floor_url: str,
                                         supervisor: Callable[..., Supervisor]) -> None:
    ledger = redis.Redis.from_url(redis_url)  # another server: the wipe spares it
    sup = supervisor(private_redis.url, queue_name, "--floor-url", floor_url,
                     "--durability", "durable", "--beat-ms", "100", "--processes", "2",
                     env={"ECHOMQ_TEST_LEDGER_URL": redis_url}).started(2)
    client = redis.Redis.from_url(private_redis.url)
    wait_until(lambda: client.hget(f"emq:{{{queue_name}}}:meta", "durability") == b"durable",
               10, "the supervisor recording the dial")
    q = echomq.Queue(queue_name, redis=client, floor=floor_url)  # the dial comes from the meta
    ids = q.add_many([("j", {"sleep": 0.01}, {"lane": f"l{i % 3}"}) for i in range(300)])
    done_key = f"ledger:{queue_name}:done"
    wait_until(lambda: ledger.llen(done_key) >= 30, 30, "some jobs done")
    client.flushall()  # Valkey loses everything mid-run
    ids += q.add_many([("j", {}) for _ in range(20)])
    wait_until(lambda: set(ids) <= {x.decode() for x in ledger.lrange(done_key, 0, -1)},
               60, "every job done")
    sup.wait_for_log(r"epoch missing; restored [1-9]")
    runs = Counter(x.decode() for x in ledger.lrange(done_key, 0, -1))
    assert not set(ids) - set(runs)  # none lost
    with Floor.from_url(floor_url) as floor:
        # rows close within a beat of each finish; those of jobs that finished between the
        # wipe and the rehydration (no fold lease in the lost meta) wait for the orphan pass
        def only_finished_left() -> bool:
            jobs = [q.get(r.job_id) for r in floor.open_rows(queue_name, None, 1000)]
            return all(j is None or j.state == "completed" for j in jobs)

        wait_until(only_finished_left, 30, "the rows of unfinished jobs closed")
    q.floor.dispose()


def test_a_chord_whose_member_a_dead_consumer_claimed_late_survives_a_wipe(
        private_redis: LocalRedis, redis_url: str, queue_name: str, floor_url: str,
        supervisor: Callable[..., Supervisor]) -> None:
    # the consumer dies with its claim on the way to the server, and the server runs the
    # claim only after the supervisor handed back what the consumer held: had it leased the
    # chord's member, its lease would run out unextended and the reap charge it a stall it
    # never ran (max_stalls=0: dead), its callback dead with it, their rows closed as dead
    # jobs' rows are; Valkey losing its data once the rows closed would take both, neither
    # ever run. Every job must run
    ledger = redis.Redis.from_url(redis_url)  # another server: the wipe spares it
    with Proxy(private_redis.port) as proxy:
        sup = supervisor(proxy.url, queue_name, "--floor-url", floor_url,
                         "--durability", "durable", "--beat-ms", "100", "--processes", "1",
                         "--lease-ms", "1000", env={"ECHOMQ_TEST_LEDGER_URL": redis_url}
                         ).started(1)
        client = redis.Redis.from_url(private_redis.url)
        wait_until(lambda: client.hget(f"emq:{{{queue_name}}}:meta", "durability")
                   == b"durable", 10, "the supervisor recording the dial")
        held = proxy.hold(script(scripts.CLAIM))  # the supervisor itself never claims
        q = echomq.Queue(queue_name, redis=client, floor=floor_url, max_stalls=0)
        member, callback = q.add_many([("j", {}, {"job_id": "member"}),
                                       ("j", {}, {"job_id": "callback", "after": ["member"]})])
        assert held.wait_held(1, 10), "the consumer sent no claim"
        [child] = psutil.Process(sup.proc.pid).children()
        child.kill()
        sup.wait_for_log(rf"consumer {child.pid} killed by SIGKILL")  # after the hand-back
        held.let_go(1)  # the dead consumer's claim reaches the server now
        assert held.wait_answered(1, 10), "the server did not run the dead consumer's claim"
        held.let_go()
        wait_until(lambda: all(q.get(j).state in ("completed", "dead")  # type: ignore[union-attr]
                               for j in (member, callback)), 30, "the chord to end")
        assert q.floor is not None
        wait_until(lambda: not q.floor.rows(queue_name, [member, callback]),  # type: ignore[union-attr]
                   10, "the rows of the ended jobs to close")
        # the first lead's rehydration (a new queue has no epoch) takes beats of its own
        # when the chord's rows are on the floor already: the loss comes after it
        sup.wait_for_log(r"epoch missing; restored \d+ job\(s\)")
        client.flushall()  # Valkey loses everything
        sup.wait_for_log(r"epoch missing; restored \d+ job\(s\)", 2)
        done_key = f"ledger:{queue_name}:done"
        wait_until(lambda: {member, callback} <= {x.decode() for x in
                                                  ledger.lrange(done_key, 0, -1)},
                   30, "the chord's jobs to run")
    q.floor.dispose()


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_add_many_cut_at_its_durable_mark_and_sent_again_leaves_every_row_open(
        private_redis: LocalRedis, queue_name: str, floor_url: str, when: str) -> None:
    # the producer's connection fails between the admit and the floor write: before the
    # mark reaches the server, or after it ran with its reply lost (as a restart of the
    # server meets it). add_many raises; sent again with the same job ids (as a producer
    # retries), it admits nothing twice and every job, a chord's callback too, has its
    # open row when it returns
    with Proxy(private_redis.port) as proxy:
        q = echomq.Queue(queue_name, redis_url=proxy.url, floor=floor_url,
                         durability="durable")
        jobs = [("j", {"i": i}, {"job_id": f"m{i}"}) for i in range(3)] + [
            ("j", {}, {"job_id": "callback", "after": ["m0", "m1", "m2"]})]
        # "after": the mark that ran (not a NOSCRIPT refusal, which reloads and calls again)
        ran = (lambda reply: reply[:1] != b"-") if when == "after" else None
        cut = proxy.cut(script(scripts.DURABLE_MARK), when=when, reply=ran)
        with pytest.raises(ConnectionFailed):
            q.add_many(jobs)
        assert cut.fired.wait(10)
        ids = q.add_many(jobs)
        assert q.floor is not None
        rows = {r.job_id: r.fields["state"] for r in q.floor.rows(queue_name, ids)}
        assert rows == {"m0": "waiting", "m1": "waiting", "m2": "waiting",
                        "callback": "blocked"}, rows
        q.floor.dispose()
        q.close()


def test_outbox_rows_are_relayed_by_the_supervisor(private_redis: LocalRedis,
                                                   queue_name: str, floor_url: str,
                                                   supervisor: Callable[..., Supervisor]
                                                   ) -> None:
    sup = supervisor(private_redis.url, queue_name, "--floor-url", floor_url,
                     "--beat-ms", "200").started(1)
    engine = sa.create_engine(floor_url)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    with engine.begin() as conn:
        committed = q.add("j", {}, tx=conn)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        rolled_back = q.add("j", {}, tx=conn)
        raise RuntimeError("rollback")
    assert q.result(committed, timeout=30) == "ok"
    assert q.get(rolled_back) is None

    def rows() -> int:
        with engine.connect() as conn:
            return int(conn.scalar(sa.text("SELECT count(*) FROM emq_outbox")))

    # the result wakes at the admit, a round trip before the relay's delete commits
    wait_until(lambda: rows() == 0, 10, "the relayed row deleted")
    assert sup.proc.poll() is None
    engine.dispose()


def test_a_supervisor_without_a_floor_relays_the_outbox_url(
        private_redis: LocalRedis, queue_name: str, tmp_path: Path,
        supervisor: Callable[..., Supervisor]) -> None:
    app = f"sqlite:///{tmp_path / 'app.db'}"
    with Floor.from_url(app) as db:  # as `echomq-supervisor migrate --outbox-url` does
        db.upgrade()
    sup = supervisor(private_redis.url, queue_name, "--outbox-url", app,
                     "--beat-ms", "200").started(1)
    engine = sa.create_engine(app)
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    with engine.begin() as conn:
        jid = q.add("j", {}, tx=conn)
    assert q.result(jid, timeout=30) == "ok"
    assert sup.proc.poll() is None
    engine.dispose()


def test_a_failing_outbox_relay_shows_in_readyz_and_metrics(
        private_redis: LocalRedis, queue_name: str, tmp_path: Path,
        supervisor: Callable[..., Supervisor]) -> None:
    """The application's database locked: the relay's batches fail, which /readyz and
    /metrics say (the supervisor stays ready: its consumers run what is admitted), and
    say no more once it is back and the row relayed."""
    import json
    import sqlite3
    import urllib.error
    import urllib.request

    from echomq.supervisor.drills.localredis import free_port

    path = tmp_path / "app.db"
    with Floor.from_url(f"sqlite:///{path}") as db:
        db.upgrade()
    port = free_port()
    supervisor(private_redis.url, queue_name, "--outbox-url", f"sqlite:///{path}",
               "--beat-ms", "100", "--health-port", str(port)).started(1)
    base = f"http://127.0.0.1:{port}"

    def metrics() -> str:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            return resp.read().decode()

    outbox = lambda: readyz(base)["queues"][queue_name].get("outbox", "")  # noqa: E731
    wait_until(lambda: outbox() == "ok", 10, "the relay ok in /readyz")
    q = echomq.Queue(queue_name, redis_url=private_redis.url)
    lock = sqlite3.connect(path, timeout=1, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # the relay's BEGIN IMMEDIATE waits out its timeout
    try:
        wait_until(lambda: outbox().startswith("failing"), 15, "the failing relay shown")
        assert readyz(base)["ready"] is True
        assert f'echomq_outbox_up{{queue="{queue_name}"}} 0.0' in metrics()
        lock.execute("INSERT INTO emq_outbox (queue, job_id, spec, created_ms) VALUES "
                     "(?, 'app-1', ?, 0)", (queue_name, json.dumps({"args": [
                         "app-1", "j", "{}", "default", 3, 1, "", "", "", "", "0"],
                         "due": None})))
    finally:
        lock.execute("COMMIT")
        lock.close()
    wait_until(lambda: outbox() == "ok", 15, "the relay back in /readyz")
    wait_until(lambda: getattr(q.get("app-1"), "state", None) == "completed", 15,
               "the row relayed and run")
    text = metrics()
    assert f'echomq_outbox_up{{queue="{queue_name}"}} 1.0' in text
    assert f'echomq_outbox_relayed_total{{queue="{queue_name}"}} 1.0' in text
    q.close()
