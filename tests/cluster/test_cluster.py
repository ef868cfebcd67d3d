"""EchoMQ on a real Valkey Cluster: 3 masters, 3 replicas, queues on every master."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from echomq.supervisor.drills.localcluster import LocalCluster
from echomq.supervisor.drills.localredis import LocalRedis, free_port
from redis.cluster import RedisCluster

import echomq
from echomq import connection, scripts
from echomq.connection import connect, slot_of
from echomq.keys import Keys
from echomq.lanes import Lanes
from echomq.wake import Doorbell

from .conftest import Supervisor, spread_queues, wait_until

QUEUES = 30


def _done(r: redis.Redis, queue: str) -> Counter[str]:
    return Counter(x.decode() for x in r.lrange(f"ledger:{queue}:done", 0, -1))


def test_any_node_url_gives_a_cluster_client(cluster: LocalCluster, redis_url: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for node in cluster.nodes:
        client = connect(node.url)
        assert isinstance(client, RedisCluster)
        assert len(client.get_primaries()) == 3
        client.close()
    assert type(connect(redis_url)) is redis.Redis
    monkeypatch.setenv("ECHOMQ_CLUSTER", "0")
    assert type(connect(cluster.url)) is redis.Redis
    monkeypatch.setenv("ECHOMQ_CLUSTER", "1")
    assert isinstance(connect(cluster.url), RedisCluster)


def test_queues_spread_over_every_master(rc: RedisCluster) -> None:
    names = spread_queues(rc, QUEUES)
    owners = Counter(rc.get_node_from_key(Keys(n).wake).name for n in names)
    assert len(owners) == 3 and set(owners.values()) == {QUEUES // 3}


def test_one_supervisor_serves_thirty_queues_on_every_node(
        cluster: LocalCluster, rc: RedisCluster, r: redis.Redis,
        supervisor: Callable[..., Supervisor]) -> None:
    names = spread_queues(rc, QUEUES)
    sup = supervisor(cluster.url, names, "--beat-ms", "200", "--lease-ms", "5000")
    sup.wait_for_log(r"consumer \d+ started", QUEUES)
    expected: dict[str, set[str]] = {}
    retried_ids: dict[str, str] = {}
    by_queue = {n: [("now", {}) for _ in range(5)] for n in names}
    ids = echomq.add_many(by_queue, redis=rc)  # admit: one pipeline over every node
    for n in names:
        q = echomq.Queue(n, redis=rc)
        later = q.add("later", {}, delay=0.3)  # schedule
        retried = q.add("retry", {"fail_first": True}, backoff=0.05)  # settle: retry
        expected[n] = {*ids[n], later, retried}
        retried_ids[n] = retried
    queues = [echomq.Queue(n, redis=rc) for n in names]
    # results: a waiter parks on the owning node until the retried job settles
    for q in queues:
        try:
            assert q.result(retried_ids[q.name], timeout=60) == "ok", q.name
        except TimeoutError:  # what the job and the supervisor were doing, to tell why
            job = rc.hgetall(q.keys.job(retried_ids[q.name]))
            told = [line for line in sup.lines if q.name in line or "WARNING" in line
                    or "ERROR" in line]
            raise AssertionError(f"{q.name}: {job} {q.counts()}\n" + "\n".join(told[-60:])
                                 ) from None
    wait_until(lambda: all(q.counts()["completed"] == 7 for q in queues), 90,
               "every job of every queue to complete")
    # pause, cancel, resume on every queue: a job cancelled while paused never runs,
    # the one added while paused runs after the resume
    cancelled: dict[str, str] = {}
    for q in queues:
        assert q.pause() is True and q.stats()["paused"] is True, q.name
        cancelled[q.name] = q.add("held", {})
        assert q.cancel(cancelled[q.name]) is True, q.name
        expected[q.name].add(q.add("after", {}))
    for q in queues:
        assert q.get(cancelled[q.name]).state == "cancelled", q.name  # type: ignore[union-attr]
        assert q.resume() is True, q.name
    wait_until(lambda: all(q.counts()["completed"] == 8 for q in queues), 90,
               "every queue's job added while paused to complete after the resume")
    for n in names:
        assert _done(r, n) == Counter({job_id: 1 for job_id in expected[n]}), n
        counts = echomq.Queue(n, redis=rc).counts()
        assert counts == {"waiting": 0, "scheduled": 0, "active": 0, "completed": 8,
                          "dead": 0, "cancelled": 1, "blocked": 0}, n
    assert sup.stop() == 0, sup.log[-3000:]


def test_add_many_across_queues_groups_by_slot(rc: RedisCluster) -> None:
    names = spread_queues(rc, 6)
    jobs = {n: [("j", {"i": i}) for i in range(4)] for n in names}
    ids = echomq.add_many(jobs, redis=rc)
    assert {n: len(v) for n, v in ids.items()} == {n: 4 for n in names}
    for n in names:
        assert echomq.Queue(n, redis=rc).counts()["waiting"] == 4
    with pytest.raises(echomq.PayloadError):  # one bad job: nothing of any queue is sent
        echomq.add_many({names[0]: [("ok", {})], names[1]: [("bad", {1, 2})]}, redis=rc)
    assert echomq.Queue(names[0], redis=rc).counts()["waiting"] == 4


def test_scripts_are_reloaded_on_the_owning_node(cluster: LocalCluster,
                                                 rc: RedisCluster) -> None:
    [name] = spread_queues(rc, 1)
    q = echomq.Queue(name, redis=rc)
    owner = cluster.master_of(q.keys.wake)
    node = cluster.client(owner)
    node.script_flush()
    assert node.script_exists(scripts.ADMIT.sha) == [False]
    q.add("a", {})
    assert node.script_exists(scripts.ADMIT.sha) == [True]
    ran: list[str] = []
    echomq.Consumer(q, lambda job: ran.append(job.id)).run(burst=True)
    assert len(ran) == 1


def test_sync_admit_is_on_a_replica_when_add_returns(cluster: LocalCluster,
                                                     rc: RedisCluster) -> None:
    [name] = spread_queues(rc, 1)
    q = echomq.Queue(name, redis=rc, durability="sync")
    replica = cluster.client(cluster.replica_of(cluster.master_of(q.keys.wake)))
    replica.execute_command("READONLY")
    for i in range(20):
        job_id = q.add("j", {"i": i})
        assert replica.hget(q.keys.job(job_id), "state") == b"waiting"


def test_doorbell_parks_on_the_owning_node(cluster: LocalCluster, rc: RedisCluster) -> None:
    names = spread_queues(rc, 3)
    for name in names:
        k = Keys(name)
        bell = Doorbell(rc, k.wake, beat_s=30)
        bell.arm()
        assert bell.conn.port == cluster.master_of(k.wake).port
        rc.lpush(k.wake, "1")
        rung, _ = bell.wait(10)
        assert rung
        bell.close()


def test_slot_migration_while_draining_loses_nothing_and_runs_nothing_twice(
        cluster: LocalCluster, rc: RedisCluster) -> None:
    [name] = spread_queues(rc, 1)
    q = echomq.Queue(name, redis=rc)
    ids = q.add_many([("j", {"i": i}) for i in range(300)])
    ran: list[str] = []
    lock = threading.Lock()
    moved = threading.Event()

    def handle(job: echomq.Job) -> None:
        with lock:
            ran.append(job.id)
        if len(ran) == 100:
            moved.wait(30)  # the slot moves while this consumer holds a leased job

    consumer = echomq.Consumer(q.name, handle, redis_url=cluster.url, beat_ms=200,
                               claim_batch=4)
    worker = threading.Thread(target=consumer.run, daemon=True)
    worker.start()
    wait_until(lambda: len(ran) >= 100, 60, "the drain to be under way")
    slot = slot_of(q.keys.prefix)
    source = cluster.owner(slot)
    target = next(n for n in (cluster.owner(0), cluster.owner(16383), cluster.owner(8000))
                  if n is not source)
    assert cluster.begin_move(slot, target) > 0
    # the slot is still the source's, which holds none of its keys now: a read is
    # answered with ASK and served by the target
    src = cluster.client(source)
    assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert cluster.owner(slot) is source
    job = q.get(ids[-1])
    assert job is not None and job.state == "waiting"
    cluster.finish_move(slot, target)
    moved.set()
    assert cluster.owner(slot) is target
    q.add_many([("late", {"i": i}, {"job_id": f"late-{i}"}) for i in range(20)])
    wait_until(lambda: len(ran) >= 320, 60, "the drain to finish on the new owner")
    consumer.stop()
    worker.join(10)
    assert Counter(ran) == Counter({job_id: 1 for job_id in
                                    [*ids, *(f"late-{i}" for i in range(20))]})
    assert q.counts()["completed"] == 320
    assert connection.node_client(rc, q.keys.wake).connection_pool.connection_kwargs[
        "port"] == target.port


@pytest.mark.parametrize("handler", ["cluster_jobs:record", "cluster_jobs:record_async"])
def test_concurrent_consumers_drain_queues_on_every_node(
        cluster: LocalCluster, rc: RedisCluster, r: redis.Redis,
        supervisor: Callable[..., Supervisor], handler: str) -> None:
    names = spread_queues(rc, 6)
    sup = supervisor(cluster.url, names, "--concurrency", "4", "--beat-ms", "200",
                     handler=handler)
    sup.wait_for_log(r"consumer \d+ started", len(names))
    ids = echomq.add_many({n: [("c", {"sleep": 0.01}) for _ in range(40)] for n in names},
                          redis=rc)
    queues = [echomq.Queue(n, redis=rc) for n in names]
    wait_until(lambda: all(q.counts()["completed"] == 40 for q in queues), 90,
               "every job of every queue to complete")
    for n in names:
        assert _done(r, n) == Counter({job_id: 1 for job_id in ids[n]}), n
    assert sup.stop() == 0, sup.log[-3000:]
    assert "Traceback" not in sup.log, sup.log[-3000:]


def test_a_plain_server_on_a_former_cluster_nodes_address_gets_a_plain_client() -> None:
    """The mode seen once per URL is not trusted past a failure: a plain server started
    where a cluster node used to listen (a redeploy, a reused port) is asked again."""
    port = free_port()
    # its bus on a port of its own: the default (port + 10000) overflows past port 55535
    node = LocalRedis(port, extra_args=("--cluster-enabled", "yes",
                                        "--cluster-port", str(free_port()))).start()
    try:
        assert connection.cluster_mode(node.url)
    finally:
        node.stop()
    plain = LocalRedis(port).start()
    try:
        client = connect(plain.url)
        assert type(client) is redis.Redis
        assert client.ping()  # its options are a plain client's, none of the cluster's
        q = echomq.Queue("former-node", redis_url=plain.url)
        job_id = q.add("x", {})
        assert q.get(job_id).state == "waiting"
    finally:
        plain.stop()


def test_the_echomq_cli_on_a_cluster_sees_and_operates_queues_of_every_node(
        cluster: LocalCluster, rc: RedisCluster) -> None:
    """`echomq` with any node's URL: `queues` lists the queues of every master, and the
    per-queue commands reach each queue's owning node."""
    names = spread_queues(rc, 6)
    ids = {n: echomq.Queue(n, redis=rc).add("x", {"n": i}) for i, n in enumerate(names)}

    def cli(url: str, *argv: str) -> tuple[int, Any]:
        done = subprocess.run([sys.executable, "-m", "echomq.ops.cli", "--redis-url", url,
                               "--json", *argv], capture_output=True, text=True, timeout=60)
        return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None

    for node in cluster.nodes:  # any node's URL, masters and replicas alike
        code, listing = cli(node.url, "queues")
        assert code == 0
        assert {row["queue"] for row in listing} >= set(names)
    url = cluster.url
    for n in names:
        assert cli(url, "stats", n)[1]["waiting"] == 1, n
        assert cli(url, "show", n, ids[n])[1]["state"] == "waiting", n
        assert cli(url, "pause", n)[1]["paused"] is True, n
        assert cli(url, "cancel", n, ids[n])[1]["cancelled"] is True, n
        assert cli(url, "resume", n)[1]["paused"] is False, n
        assert cli(url, "purge", n, "--state", "cancelled")[1]["purged"] == 1, n
        assert echomq.Queue(n, redis=rc).get(ids[n]) is None, n


def test_a_deferred_job_handed_back_on_a_cluster_is_logged_for_the_floor(
        rc: RedisCluster) -> None:
    [name] = spread_queues(rc, 1)
    q = echomq.Queue(name, redis=rc)
    node_now = int(rc.time()[0]) * 1000
    rc.hset(q.keys.meta, "fold", node_now + 60_000)  # a scheduler's fold lease holds
    job_id = q.add("d", {}, delay=600)  # logged as it is scheduled
    rc.zadd(q.keys.schedule, {job_id: 0})
    assert scripts.promote(rc, q.keys, 10)[0] == 1
    lanes = Lanes(rc, q.keys, q.settings)
    [held] = lanes.claim(1)
    assert lanes.release([(held.id, held.token)], "unstarted") == (1, 0)
    [held] = lanes.claim(1)
    rc.zadd(q.keys.leases, {held.id: 0})  # its lease lapsed
    assert scripts.reap(rc, q.keys)[:2] == (1, 0)
    assert [x.decode() for x in rc.lrange(q.keys.fold, 0, -1)] == [job_id] * 3
