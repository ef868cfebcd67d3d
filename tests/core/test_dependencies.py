"""Dependencies: add(after=...), the blocked state, the fan-in counted once per dependency."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import echomq
import echomq.aio
from echomq import depend
from echomq.errors import UnknownDependency
from echomq.lanes import Lanes, Outcome


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[echomq.Queue]:
    queue = echomq.Queue(queue_name, redis_url=redis_url)
    yield queue
    queue.close()


def _lanes(q: echomq.Queue) -> Lanes:
    return Lanes(q.redis, q.keys, q.settings)


def _run(q: echomq.Queue, handler: Any) -> int:
    return echomq.Consumer(q, handler, beat_ms=200).run(burst=True)


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    """Re-check a condition (a client list: no event to wait on) until the deadline."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


def _h(q: echomq.Queue, jid: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in q.redis.hgetall(q.keys.job(jid)).items()}


def test_blocked_until_every_dependency_completed(q: echomq.Queue) -> None:
    a, b = q.add("a", 1), q.add("b", 2)
    c = q.add("c", None, after=[a, b])
    assert q.get(c).state == "blocked"
    assert q.counts()["blocked"] == 1 and q.counts()["waiting"] == 2
    assert [j.id for j in q.jobs("blocked")] == [c]
    assert q.get(c).after == (a, b) and q.get(a).dependents == (c,)
    lanes = _lanes(q)
    [first] = lanes.claim()
    lanes.settle([Outcome(first.id, first.token, "c", "10")])
    assert q.get(c).state == "blocked"  # one of two completed
    [second] = lanes.claim()
    lanes.settle([Outcome(second.id, second.token, "c", "20")])
    assert q.get(c).state == "waiting" and q.counts()["blocked"] == 0
    [third] = lanes.claim()
    assert third.id == c
    assert depend.read_results(q.redis, q.keys, c) == {a: 10, b: 20}


def test_release_rings_the_doorbell_for_a_parked_consumer(q: echomq.Queue) -> None:
    seen: list[dict[str, Any]] = []

    def handler(job: echomq.Job) -> Any:
        seen.append(job.dependency_results())
        return "done"

    a, b = q.add("a", 1), q.add("b", 2)
    c = q.add("c", None, after=[b, a])
    lanes = _lanes(q)
    held = {j.id: j for j in lanes.claim(2)}  # the dependencies run here, not in the consumer
    q.redis.delete(q.keys.wake, q.keys.marker)  # the admits' rings: nothing left to claim
    consumer = echomq.Consumer(q, handler, beat_ms=60_000)  # no beat: only the doorbell
    threading.Thread(target=consumer.run, daemon=True).start()
    try:
        wait_until(lambda: any(c["cmd"] in ("blpop", "bzpopmin") and "b" in c["flags"]
                               for c in q.redis.client_list()), 10, "the consumer to park")
        lanes.settle([Outcome(a, held[a].token, "c", "10")])
        lanes.settle([Outcome(b, held[b].token, "c", "20")])  # the release rings
        assert q.result(c, timeout=10) == "done"
    finally:
        consumer.stop()
    assert seen == [{b: 20, a: 10}]  # in the order given


def test_completed_dependency_counts_as_done(q: echomq.Queue) -> None:
    a = q.add("a", 3)
    assert _run(q, lambda job: job.payload) == 1
    c = q.add("c", None, after=[a])
    assert q.get(c).state == "waiting"
    assert depend.read_results(q.redis, q.keys, c) == {a: 3}


def test_unknown_dependency_admits_nothing(q: echomq.Queue) -> None:
    a = q.add("a")
    with pytest.raises(UnknownDependency, match="nope"):
        q.add("c", after=[a, "nope"])
    with pytest.raises(UnknownDependency):
        q.add_many([("x", 1), ("y", 2, {"after": [a]}), ("z", 3, {"after": ["nope"]})])
    assert q.counts()["waiting"] == 1 and q.counts()["blocked"] == 0
    assert q.get(a).dependents == ()


def test_a_dependency_spilled_to_the_floor_is_refused(q: echomq.Queue) -> None:
    far = q.add("far", delay=7200)
    q.redis.hset(q.keys.job(far), "spilled", 1)  # as spill.lua leaves its stub
    with pytest.raises(ValueError, match="spill horizon"):
        q.add("c", after=[far])
    assert q.counts()["blocked"] == 0


def test_add_many_orders_dependencies_within_the_batch(q: echomq.Queue) -> None:
    ids = q.add_many([("a", 1, {"job_id": "a1"}), {"name": "b", "after": ["a1"]},
                      ("late", 1, {"delay": 60})])
    assert [q.get(i).state for i in ids] == ["waiting", "blocked", "scheduled"]


def test_a_stale_settle_never_counts_twice(q: echomq.Queue) -> None:
    """A member run twice (its lease expired, it was handed out again): the first run's
    late settle is refused, and the dependent is counted down once."""
    a, b = q.add("a"), q.add("b")
    c = q.add("c", after=[a, b])
    lanes = _lanes(q)
    claimed = {j.id: j for j in lanes.claim(2)}
    first = claimed[a]
    lanes.release([(a, first.token)], "requeue")  # as a reap of the lapsed lease would
    [again] = [j for j in lanes.claim(2) if j.id == a]
    assert lanes.settle([Outcome(a, again.token, "c", "1")]) == [echomq.scripts.Settled.COMPLETED]
    assert lanes.settle([Outcome(a, first.token, "c", "1")]) == [echomq.scripts.Settled.STALE]
    assert lanes.settle([Outcome(a, again.token, "c", "1")]) == [echomq.scripts.Settled.STALE]
    assert _h(q, c)["deps_left"] == "1" and q.get(c).state == "blocked"
    lanes.settle([Outcome(b, claimed[b].token, "c", "2")])
    assert q.get(c).state == "waiting"


def test_a_dependency_that_ends_twice_counts_once(q: echomq.Queue) -> None:
    """on_dep_failure="run": a dependency that died, was retried and completed counted
    when it died; its completion does not count again."""
    a, b = q.add("a", max_attempts=1), q.add("b")
    c = q.add("c", after=[a, b], on_dep_failure="run")
    lanes = _lanes(q)
    claimed = {j.id: j for j in lanes.claim(2)}
    lanes.settle([Outcome(a, claimed[a].token, "d", "boom")])
    assert _h(q, c)["deps_left"] == "1"
    assert q.retry_dead([a]) == 1
    [rerun] = lanes.claim()
    lanes.settle([Outcome(a, rerun.token, "c", "1")])
    assert q.get(c).state == "blocked" and _h(q, c)["deps_left"] == "1"
    lanes.settle([Outcome(b, claimed[b].token, "c", "2")])
    assert q.get(c).state == "waiting"
    assert depend.read_results(q.redis, q.keys, c) == {b: 2}  # a's first end was its death


def test_a_dead_dependency_ends_the_graph_below_it(q: echomq.Queue) -> None:
    a = q.add("a", max_attempts=1)
    b = q.add("b", after=[a])
    c = q.add("c", after=[b])
    d = q.add("d", after=[b], on_dep_failure="run")

    def handler(job: echomq.Job) -> Any:
        if job.name == "a":
            raise RuntimeError("boom")
        return job.dependency_results()

    _run(q, handler)
    assert (q.get(b).state, q.get(b).error) == ("dead", f"dependency {a} dead")
    assert (q.get(c).state, q.get(c).error) == ("dead", f"dependency {b} dead")
    assert (q.get(d).state, q.get(d).result) == ("completed", {})
    assert q.counts()["dead"] == 3 and q.counts()["blocked"] == 0
    late = q.add("late", after=[c])  # a dependency dead already
    assert (q.get(late).state, q.get(late).error) == ("dead", f"dependency {c} dead")


def test_cancel_ends_dependents_and_a_blocked_job_cancels(q: echomq.Queue) -> None:
    a = q.add("a")
    b = q.add("b", after=[a])
    c = q.add("c", after=[b])
    assert q.cancel(b)
    assert q.get(b).state == "cancelled" and q.counts()["blocked"] == 0
    assert (q.get(c).state, q.get(c).error) == ("dead", f"dependency {b} cancelled")
    d = q.add("d", after=[a])
    assert q.cancel(a)
    assert (q.get(d).state, q.get(d).error) == ("dead", f"dependency {a} cancelled")


def test_a_reaped_member_past_its_stalls_kills_its_dependents(q: echomq.Queue) -> None:
    a = q.add("a")
    b = q.add("b", after=[a])
    lanes = _lanes(q)
    q.redis.hset(q.keys.job(a), "max_stalls", 0)
    [job] = lanes.claim()
    lanes.release([(a, job.token)], "stall")
    assert q.get(a).state == "dead"
    assert (q.get(b).state, q.get(b).error) == ("dead", f"dependency {a} dead")


def test_a_buried_dependency_kills_its_dependents(q: echomq.Queue) -> None:
    a = q.add("a", delay=60)
    b = q.add("b", after=[a])
    keys = [q.keys.schedule, q.keys.dead, q.keys.stats, q.keys.spilled, q.keys.events]
    assert echomq.scripts.BURY(q.redis, keys, [q.keys.prefix, a, "bad due"]) == 1
    assert (q.get(b).state, q.get(b).error) == ("dead", f"dependency {a} dead")


def test_results_outlive_the_dependency_retention(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=0)
    a = q.add("a", 5)
    q.add("c", after=[a])
    results: list[Any] = []
    _run(q, lambda job: job.payload if job.name == "a" else results.append(
        job.dependency_results()))
    assert q.get(a) is None  # retention dropped the dependency at once
    assert results == [{a: 5}]


def test_a_purged_completed_job_still_counts_as_done_and_a_purged_dead_one_is_unknown(
        q: echomq.Queue) -> None:
    """purge() drops completed jobs as retention does: a later dependency on one counts
    as done (its tombstone); a dead one purged is gone, and naming it is an error."""
    done, dead = q.add("a", job_id="done"), q.add("b", job_id="dead", max_attempts=1)

    def handler(job: echomq.Job) -> None:
        if job.id == dead:
            raise RuntimeError("planned death")

    _run(q, handler)
    assert q.purge("completed") == 1 and q.purge("dead") == 1
    assert q.get(q.add("c", after=[done])).state == "waiting"  # type: ignore[union-attr]
    with pytest.raises(echomq.errors.UnknownDependency, match=f"unknown dependency '{dead}'"):
        q.add("d", after=[dead])


@pytest.mark.parametrize("after, opts, error", [
    ("abc", {}, TypeError),
    ([f"j{i}" for i in range(depend.MAX_DEPENDENCIES + 1)], {}, ValueError),
    (["x"], {"on_dep_failure": "maybe"}, ValueError),
    (["x"], {"delay": 5}, ValueError),
    (["bad id"], {}, echomq.errors.InvalidName),
    (["self"], {"job_id": "self"}, ValueError),
])
def test_bad_dependencies_admit_nothing(q: echomq.Queue, after: Any, opts: dict[str, Any],
                                        error: type[Exception]) -> None:
    q.add("x", job_id="x")
    with pytest.raises(error):
        q.add("c", after=after, **opts)
    assert sum(q.counts().values()) == 1


def test_aio_add_after(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    async def main() -> tuple[str, str]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        a = await aq.add("a")
        c = await aq.add("c", after=[a])
        with pytest.raises(UnknownDependency):
            await aq.add("d", after=["nope"])
        ids = await aq.add_many([{"name": "e", "after": [a, c]}])
        await aq.close()
        return c, ids[0]

    c, e = asyncio.run(main())
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.get(c).state == "blocked" and q.get(e).after == (q.get(c).after[0], c)
    assert q.counts()["blocked"] == 2


def test_a_server_missing_one_of_the_scripts_admits_a_mixed_batch_whole(
        q: echomq.Queue) -> None:
    # a deferred job (schedule.lua) and 600 jobs waiting for it (block.lua, two calls), in
    # one MULTI/EXEC, on a server that lost its scripts and got block.lua back alone: at
    # EXEC the schedule call would fail NOSCRIPT while the block calls ran and refused its
    # id (marking the batch refused), so the rerun after the load refused too
    jobs = [("d", {}, {"job_id": "d", "delay": 60})] + [
        ("w", {"i": i}, {"after": ["d"]}) for i in range(600)]
    q.redis.script_flush()
    echomq.scripts.BLOCK.load(q.redis)
    ids = q.add_many(jobs)
    assert len(ids) == 601
    assert q.counts()["scheduled"] == 1 and q.counts()["blocked"] == 600
