"""``echomq.aio`` on a real Valkey Cluster: queues on every master, scripts on the owner."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from echomq.supervisor.drills.localcluster import LocalCluster
from redis.cluster import RedisCluster

import echomq
from echomq import scripts
from echomq.connection import connect, slot_of

from .conftest import spread_queues

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_aio_queue_admits_reads_and_cancels_on_every_master(cluster: LocalCluster,
                                                            rc: RedisCluster) -> None:
    names = spread_queues(rc, 6)

    async def main() -> dict[str, tuple[list[str], str]]:
        out = {}
        for name in names:
            aq = echomq.aio.Queue(name, redis_url=cluster.url)
            one = await aq.add("one", {"n": 1})
            many = await aq.add_many([("m", {"i": i}) for i in range(5)])
            later = await aq.add("later", {}, delay=60)
            job = await aq.get(one)
            assert job is not None and job.payload == {"n": 1}, name
            assert await aq.cancel(later) is True, name
            assert await aq.cancel(later) is False, name  # already cancelled
            assert await aq.counts() == {"waiting": 6, "scheduled": 0, "active": 0,
                                         "completed": 0, "dead": 0, "cancelled": 1,
                                         "blocked": 0}, name
            assert await aq.pause() is True and await aq.resume() is True, name
            assert aq.cluster, name
            out[name] = ([one, *many], later)
            await aq.close()
        return out

    out = _run(main())
    for name, (ids, later) in out.items():
        q = echomq.Queue(name, redis=rc)
        assert sorted(j.id for j in q.jobs("waiting")) == sorted(ids), name
        assert q.get(later).state == "cancelled"  # type: ignore[union-attr]


def test_aio_concurrent_adds_coalesce_on_the_owning_node(cluster: LocalCluster,
                                                         rc: RedisCluster) -> None:
    [name] = spread_queues(rc, 1)

    async def main() -> list[str]:
        aq = echomq.aio.Queue(name, redis_url=cluster.url)
        ids = await asyncio.gather(*(aq.add("c", {"i": i}) for i in range(200)))
        await aq.close()
        return list(ids)

    ids = _run(main())
    assert echomq.Queue(name, redis=rc).counts()["waiting"] == len(set(ids)) == 200


def test_aio_scripts_are_loaded_on_the_owning_node_only(cluster: LocalCluster,
                                                        rc: RedisCluster) -> None:
    [name] = spread_queues(rc, 1)
    owner = cluster.master_of(echomq.Queue(name, redis=rc).keys.wake)
    for node in cluster.nodes:
        cluster.client(node).script_flush()

    async def main() -> None:
        aq = echomq.aio.Queue(name, redis_url=cluster.url)
        await aq.add("a", {})
        await aq.add_many([("b", {}), ("c", {})])
        await aq.counts()
        await aq.close()

    _run(main())
    masters = {n.port for n in rc.get_primaries()}
    loaded = {n.port: cluster.client(n).script_exists(scripts.ADMIT.sha, scripts.COUNTS.sha)
              for n in cluster.nodes if n.port in masters}
    assert loaded[owner.port] == [True, True]
    assert all(v == [False, False] for port, v in loaded.items() if port != owner.port)


def test_aio_result_waits_on_the_owning_node(cluster: LocalCluster, rc: RedisCluster) -> None:
    names = spread_queues(rc, 3)
    ready = threading.Event()

    def consume(name: str) -> None:
        ready.wait(30)
        echomq.Consumer(echomq.Queue(name, redis=rc), lambda job: job.payload["x"] * 2
                        ).run(burst=True)

    async def main() -> list[Any]:
        queues = [echomq.aio.Queue(n, redis_url=cluster.url) for n in names]
        ids = [await aq.add("double", {"x": i}) for i, aq in enumerate(queues)]
        waiting = [asyncio.create_task(aq.result(job_id, timeout=60))
                   for aq, job_id in zip(queues, ids, strict=True)]
        await asyncio.sleep(0)  # the waiters park before the consumers start
        workers = [threading.Thread(target=consume, args=(n,), daemon=True) for n in names]
        for w in workers:
            w.start()
        ready.set()
        results = await asyncio.gather(*waiting)
        with pytest.raises(TimeoutError):
            await queues[0].result(await queues[0].add("never", {}), timeout=0.2)
        for aq in queues:
            await aq.close()
        return list(results)

    assert _run(main()) == [0, 2, 4]


def test_task_asend_on_a_cluster_url(cluster: LocalCluster, rc: RedisCluster) -> None:
    [name] = spread_queues(rc, 1)

    @echomq.task(queue=name, name=f"{name}.hello", lane=lambda who: f"u-{who}")
    async def hello(who: str) -> str:
        return f"hello {who}"

    echomq.configure(redis_url=cluster.url)
    try:
        async def main() -> list[str]:
            return list(await asyncio.gather(hello.asend("ann"),
                                              hello.options(delay=30).asend("bob")))

        now, later = _run(main())
    finally:
        echomq.configure(redis_url=None)
    q = echomq.Queue(name, redis=rc)
    assert q.get(now).state == "waiting"  # type: ignore[union-attr]
    assert q.get(later).state == "scheduled"  # type: ignore[union-attr]


def test_aio_result_follows_its_queue_to_a_new_owner(cluster: LocalCluster,
                                                     rc: RedisCluster) -> None:
    """A waiter parked on the owner when the queue's slot moves gets MOVED, parks again on
    the new owner and gets the result settled there."""
    [name] = spread_queues(rc, 1)
    q = echomq.Queue(name, redis=rc)
    slot = slot_of(q.keys.prefix)

    async def main() -> tuple[Any, Any]:
        aq = echomq.aio.Queue(name, redis_url=cluster.url)
        job_id = await aq.add("double", {"x": 21})
        waiting = asyncio.create_task(aq.result(job_id, timeout=60))
        source = cluster.owner(slot)
        node = cluster.client(source)

        def parked() -> bool:
            return int(node.info("clients")["blocked_clients"]) >= 1

        deadline = asyncio.get_running_loop().time() + 30
        while not parked():  # no event tells a client that another one is parked
            assert asyncio.get_running_loop().time() < deadline, "the waiter never parked"
            await asyncio.sleep(0.02)
        target = next(n for n in (cluster.owner(0), cluster.owner(16383), cluster.owner(8000))
                      if n is not source)
        await asyncio.to_thread(cluster.move_slot, slot, target)
        node.close()
        await asyncio.to_thread(lambda: echomq.Consumer(
            echomq.Queue(name, redis=connect(cluster.url)),
            lambda job: job.payload["x"] * 2).run(burst=True))
        value = await waiting
        await aq.close()
        return value, target

    value, target = _run(main())
    assert value == 42
    assert cluster.owner(slot) is target
