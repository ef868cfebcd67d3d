"""A cluster that refuses calls: CLUSTERDOWN (a master and its replica are gone), and
NOREPLICAS on one master only.

The supervisor stays up, reports the refusal once per queue and change of state (log,
/readyz, /metrics) and resumes on its own when the cluster takes writes again.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis
from echomq.supervisor.drills.localcluster import LocalCluster
from echomq.supervisor.drills.localredis import free_port

import echomq
from echomq.connection import connect
from echomq.keys import Keys

from .conftest import Supervisor, spread_queues, start_cluster, wait_until


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own: the test kills one master and its replica."""
    c = start_cluster()
    try:
        yield c
    finally:
        c.stop()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _done(r: redis.Redis, queue: str) -> Counter[str]:
    return Counter(x.decode() for x in r.lrange(f"ledger:{queue}:done", 0, -1))


def test_clusterdown_is_reported_once_and_work_resumes_when_the_master_is_back(
        own_cluster: LocalCluster, r: redis.Redis,
        supervisor: Callable[..., Supervisor]) -> None:
    c = own_cluster
    rc = connect(c.url)
    names = spread_queues(rc, 3)  # one queue per master
    lost = names[0]
    master = c.master_of(Keys(lost).wake)
    replica = c.replica_of(master)
    c.enter_away_from(Keys(lost).wake)
    rc.close()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sup = supervisor(c.url, names, "--beat-ms", "200", "--health-port", str(port))
    sup.wait_for_log(r"consumer \d+ started", len(names))
    wait_until(lambda: _get(base + "/readyz")[0] == 200, 30, "ready")

    replica.kill()
    master.kill()  # its slots have no master now: every node answers CLUSTERDOWN
    others = names[1:]

    def refused() -> bool:
        code, body = _get(base + "/readyz")
        queues = json.loads(body)["queues"]
        return code == 503 and all("CLUSTERDOWN" in queues[n]["valkey"] for n in others)

    wait_until(refused, 30, "CLUSTERDOWN in /readyz for the queues of the live masters")
    _, metrics = _get(base + "/metrics")
    for n in others:
        assert f'echomq_valkey_available{{queue="{n}"}} 0.0' in metrics, metrics
        assert f'echomq_valkey_refusals_total{{code="CLUSTERDOWN",queue="{n}"}}' in metrics
    assert sup.proc.poll() is None, sup.log

    master.start()  # the same node (its nodes.conf is kept), empty
    replica.start()
    c.wait_ok(60)
    wait_until(lambda: _get(base + "/readyz")[0] == 200, 60, "ready again")
    fresh = connect(c.url)
    ids = {n: echomq.Queue(n, redis=fresh).add("after", {}) for n in names}
    wait_until(lambda: all(_done(r, n)[ids[n]] == 1 for n in names), 60,
               "a job of every queue to run after the cluster is back")
    fresh.close()
    assert sup.proc.poll() is None, sup.log
    for n in others:  # once per change of state, not once per probe
        down = [line for line in sup.lines if f"queue {n}:" in line and "CLUSTERDOWN" in line
                and "refuses" in line]
        assert len(down) == 1, sup.log[-4000:]
        assert any(f"queue {n}: Valkey available again" in line for line in sup.lines), sup.log
    assert "Traceback" not in sup.log, sup.log[-4000:]
    assert sup.stop() == 0, sup.log[-3000:]


def test_a_refusal_on_one_master_holds_only_its_queues(
        cluster: LocalCluster, r: redis.Redis, supervisor: Callable[..., Supervisor]) -> None:
    """One master wants more replicas than it has (NOREPLICAS): its queue waits and says
    so, the queues of the other masters run on, and all resume when it is lifted."""
    rc = connect(cluster.url)
    names = spread_queues(rc, 3)
    held = names[0]
    node = cluster.client(cluster.master_of(Keys(held).wake))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sup = supervisor(cluster.url, names, "--beat-ms", "200", "--health-port", str(port))
    sup.wait_for_log(r"consumer \d+ started", len(names))
    wait_until(lambda: _get(base + "/readyz")[0] == 200, 30, "ready")
    node.config_set("min-replicas-to-write", "2")  # it has one
    try:
        ids = {n: echomq.Queue(n, redis=rc).add("x", {}) for n in names[1:]}
        wait_until(lambda: all(_done(r, n)[ids[n]] == 1 for n in names[1:]), 30,
                   "the queues of the other masters to run on")
        with pytest.raises(redis.exceptions.ResponseError, match="enough good replicas"):
            echomq.Queue(held, redis=rc).add("x", {})

        def refused() -> bool:
            code, body = _get(base + "/readyz")
            queues = json.loads(body)["queues"]
            return code == 503 and "NOREPLICAS" in queues[held]["valkey"] and all(
                queues[n]["healthy"] for n in names[1:])

        wait_until(refused, 30, f"NOREPLICAS in /readyz for {held} only")
        _, metrics = _get(base + "/metrics")
        assert f'echomq_valkey_refusals_total{{code="NOREPLICAS",queue="{held}"}}' in metrics
        assert sup.proc.poll() is None, sup.log
    finally:
        node.config_set("min-replicas-to-write", "0")
    job = echomq.Queue(held, redis=rc).add("x", {})
    wait_until(lambda: _done(r, held)[job] == 1, 30, "the held queue to run again")
    wait_until(lambda: _get(base + "/readyz")[0] == 200, 30, "ready again")
    down = [line for line in sup.lines if f"queue {held}:" in line and "refuses" in line]
    assert len(down) == 1, sup.log[-4000:]
    assert not any("refuses" in line or "unreachable" in line
                   for n in names[1:] for line in sup.lines if f"queue {n}:" in line), sup.log
    assert "Traceback" not in sup.log, sup.log[-4000:]
    rc.close()
    node.close()
