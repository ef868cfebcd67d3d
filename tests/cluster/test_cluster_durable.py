"""The "durable" dial on a cluster: every admitted job is on the floor before add()
returns, whichever master owns its queue, and when every master loses its data the
floor brings each queue back on its own master, waiting jobs in admit order; the
supervisor does it too, and runs each job once. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from beats import tick as _tick
from echomq.supervisor.drills.localcluster import LocalCluster
from echomq.supervisor.scheduler import Scheduler
from redis.cluster import RedisCluster

import echomq
from echomq.floor import Floor
from echomq.lanes import Lanes, Outcome

from .conftest import Supervisor, spread_queues, wait_until


@pytest.fixture(params=["sqlite", "postgresql"])
def floor_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'floor.db'}"
    make: Callable[[str], str] = request.getfixturevalue("throwaway_database")
    return make("echomq_cluster")


@pytest.fixture
def floor(floor_url: str) -> Iterator[Floor]:
    f = Floor.from_url(floor_url)
    f.upgrade()
    yield f
    f.dispose()


def _wipe(cluster: LocalCluster, rc: RedisCluster) -> None:
    """Every master loses its data (FLUSHALL on each; replicas follow)."""
    for node in rc.get_primaries():
        redis.Redis(host=node.host, port=node.port).flushall()


def test_durable_admits_reach_the_floor_and_come_back_on_their_masters(
        cluster: LocalCluster, rc: RedisCluster, floor: Floor, floor_url: str) -> None:
    names = spread_queues(rc, 3)
    queues = [echomq.Queue(n, redis=rc, floor=floor_url, durability="durable")
              for n in names]
    scheds = [Scheduler(n, rc, floor, beat_ms=100, horizon_s=3600) for n in names]
    for s in scheds:
        _tick(s)  # each leads its queue: its fold lease is set on the queue's master
    admitted: dict[str, list[str]] = {}
    for q in queues:
        ids = q.add_many([("j", {"i": i}) for i in range(200)])
        ids.append(q.add("j", {"one": True}))
        later = q.add("later", {}, delay=600)
        rows = {r.job_id for r in floor.open_rows(q.name, None, 1000)}
        assert rows == {*ids, later}  # on the floor before add returned
        admitted[q.name] = ids
    done = {}
    for q in queues:  # a few run to the end first: their rows close, they do not return
        lanes = Lanes(rc, q.keys, q.settings)
        claimed = lanes.claim(5)
        lanes.settle([Outcome(c.id, c.token, "c", "null", 0) for c in claimed])
        done[q.name] = {c.id for c in claimed}
        assert len(done[q.name]) == 5
    for s in scheds:
        _tick(s)
    _wipe(cluster, rc)
    for q in queues:
        assert q.counts()["waiting"] == 0
    for s in scheds:
        s.tick(0.0)  # notices its epoch gone
        _tick(s)
    for q in queues:
        back = [x.decode() for x in q.redis.lrange(q.keys.lane("default"), 0, -1)]
        assert back == [x for x in admitted[q.name] if x not in done[q.name]]
        assert q.counts()["scheduled"] == 1
        ran = Counter[str]()
        echomq.Consumer(q, lambda job, ran=ran: ran.update([job.id]),
                        pump_batch=500).run(burst=True)
        assert set(ran) == set(admitted[q.name]) - done[q.name]
        assert set(ran.values()) == {1}
    for s in scheds:
        _tick(s)
    assert [floor.count(n) for n in names] == [1, 1, 1]  # only the deferred ones
    for q in queues:
        q.floor.dispose()


def test_the_supervisor_brings_back_every_durable_job_after_a_wipe(
        cluster: LocalCluster, rc: RedisCluster, r: redis.Redis, floor: Floor,
        floor_url: str, supervisor: Callable[..., Supervisor]) -> None:
    names = spread_queues(rc, 3)
    queues = [echomq.Queue(n, redis=rc, floor=floor_url, durability="durable")
              for n in names]
    ids = {q.name: q.add_many([("j", {"i": i}) for i in range(100)]) for q in queues}
    assert sum(floor.count(n) for n in names) == 300
    _wipe(cluster, rc)  # before any consumer ran them: only the floor has them
    sup = supervisor(cluster.url, names, "--floor-url", floor_url, "--beat-ms", "200",
                     env={"ECHOMQ_DURABILITY": "durable"})
    wait_until(lambda: all(r.llen(f"ledger:{n}:done") >= 100 for n in names), 60,
               "every job to run")
    sup.wait_for_log(r"restored 100 job\(s\) from the floor", count=3)
    for n in names:
        ran = Counter(x.decode() for x in r.lrange(f"ledger:{n}:done", 0, -1))
        assert ran == Counter({job_id: 1 for job_id in ids[n]})
    wait_until(lambda: sum(floor.count(n) for n in names) == 0, 30,
               "the rows of the jobs that ran to close")
    for q in queues:
        q.floor.dispose()
