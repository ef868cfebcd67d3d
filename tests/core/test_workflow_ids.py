"""Workflow and dependency ids that are not new: a duplicate id in one workflow, an id
dedup reserves. Neither may leave a job blocked forever or write a stub hash."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import echomq
from echomq import depend
from echomq.errors import UnknownDependency
from echomq.lanes import Lanes, Outcome


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[echomq.Queue]:
    echomq.configure(redis_url=redis_url)
    queue = echomq.Queue(queue_name, redis_url=redis_url)
    yield queue
    queue.close()
    echomq.configure(redis_url=None)


@pytest.fixture
def work(queue_name: str) -> Any:
    @echomq.task(queue=queue_name, name=f"{queue_name}.work")
    def work(x: Any = None) -> Any:
        return x

    return work


def _complete(q: echomq.Queue) -> None:
    lanes = Lanes(q.redis, q.keys, q.settings)
    for job in lanes.claim(10):
        lanes.settle([Outcome(job.id, job.token, "c", "1")])


def test_a_duplicate_job_id_in_a_workflow_is_refused(q: echomq.Queue, work: Any) -> None:
    """Two members with one id would make the callback wait twice for one end: it would
    stay blocked forever. The workflow is refused, nothing admitted."""
    wf = echomq.chord([work.s(1).set(job_id="m"), work.s(2).set(job_id="m")], work.s())
    with pytest.raises(ValueError, match="'m'"):
        wf.send()
    assert q.redis.keys(q.keys.prefix + "*") == []


def test_block_counts_a_repeated_dependency_once(q: echomq.Queue) -> None:
    """add_blocked (what a workflow sends) with a dependency listed twice waits for it
    once: its completion releases the job."""
    a = q.add("a")
    spec = q.planner.spec("c", {}, None, None, None, "c", None, None)
    q.add_blocked([spec], [([a, a], "fail")])
    _complete(q)
    assert q.get("c").state == "waiting"


def test_a_dependency_dedup_reserves_is_unknown(q: echomq.Queue) -> None:
    """An id dedup still reserves (its job completed, its record and its tombstone gone)
    is not admitted again, so nothing may wait for it: UnknownDependency, nothing
    admitted, no stub."""
    q.add("a", job_id="x", dedup_s=600)
    _complete(q)
    assert q.purge("completed") == 1 and q.get("x") is None
    assert q.redis.zrem(q.keys.prefix + "tombs", "x") == 1  # past the tombstones' cap
    before = sorted(q.redis.keys(q.keys.prefix + "job:*"))
    with pytest.raises(UnknownDependency):
        q.add_many([("a", 1, {"job_id": "x"}), {"name": "b", "job_id": "y", "after": ["x"]}])
    assert q.get("y") is None
    assert sorted(q.redis.keys(q.keys.prefix + "job:*")) == before


def test_retry_dead_waits_again_for_a_revived_dependency(q: echomq.Queue) -> None:
    """A member died, so its chord callback ended dead; retrying every dead job revives
    both. The callback must wait for the member's rerun, not run at once without its
    result (and then never see it)."""
    lanes = Lanes(q.redis, q.keys, q.settings)
    a, b = q.add("a", job_id="a", max_attempts=1), q.add("b", job_id="b")
    c = q.add("c", job_id="c", after=[a, b])
    claimed = {j.id: j for j in lanes.claim(2)}
    lanes.settle([Outcome(a, claimed[a].token, "d", "boom"),
                  Outcome(b, claimed[b].token, "c", "2")])
    assert q.get(c).state == "dead"
    assert q.retry_dead() == 2
    assert q.get(a).state == "waiting" and q.get(c).state == "blocked"
    [rerun] = lanes.claim(2)
    assert rerun.id == a
    lanes.settle([Outcome(a, rerun.token, "c", "1")])
    assert q.get(c).state == "waiting"
    assert depend.read_results(q.redis, q.keys, c) == {a: 1, b: 2}


def test_retry_dead_leaves_a_job_whose_dependency_is_still_dead(q: echomq.Queue) -> None:
    lanes = Lanes(q.redis, q.keys, q.settings)
    a = q.add("a", job_id="a", max_attempts=1)
    c = q.add("c", job_id="c", after=[a])
    [job] = lanes.claim(1)
    lanes.settle([Outcome(a, job.token, "d", "boom")])
    assert q.retry_dead([c]) == 0
    assert q.get(c).state == "dead" and q.get(a).state == "dead"
    assert q.retry_dead() == 2  # both at once: the chain waits again, in its order
    assert q.get(a).state == "waiting" and q.get(c).state == "blocked"


def test_a_chord_over_the_dependency_limit_is_refused(q: echomq.Queue, work: Any) -> None:
    """A callback waits for every member: more members than a job may wait for is a
    ValueError before anything is sent, as add(after=...) is."""
    members = [work.s(i) for i in range(depend.MAX_DEPENDENCIES + 1)]
    with pytest.raises(ValueError, match="at most 10,000 dependencies"):
        echomq.chord(members, work.s()).send()
    assert q.redis.keys(q.keys.prefix + "*") == []


def test_a_group_result_outlives_the_queue_retention(redis_url: str, queue_name: str,
                                                     work: Any) -> None:
    """A group's result is its members' results: retention may not drop them before
    Workflow.result reads them (kept until the workflow ends)."""
    from echomq.task import tasks_on
    echomq.configure(redis_url=redis_url)
    wf = echomq.group(work.s(i) for i in range(5)).send()
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=2)
    echomq.Consumer(q, tasks_on(queue_name), beat_ms=200).run(burst=True)
    assert wf.result(timeout=10) == [0, 1, 2, 3, 4]


def test_a_completed_dependency_retention_dropped_counts_as_done(redis_url: str,
                                                                 queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=0)
    a = q.add("a")
    _complete(q)
    assert q.get(a) is None
    c = q.add("c", after=[a])
    assert q.get(c).state == "waiting"
    assert depend.read_results(q.redis, q.keys, c) == {a: None}  # done, its result gone


def test_tombstones_are_capped_to_the_newest(redis_url: str, queue_name: str) -> None:
    """Tombstones are bounded: past the cap the oldest go (a dependency on one of those is
    unknown again), the newest stay."""
    q = echomq.Queue(queue_name, redis_url=redis_url, keep_completed=0)
    tombs = q.keys.prefix + "tombs"
    with q.redis.pipeline(transaction=False) as pipe:
        for start in range(0, depend.TOMBSTONES, 10_000):
            pipe.zadd(tombs, {f"old{i}": i for i in range(start, start + 10_000)})
        pipe.execute()
    a = q.add("a")
    _complete(q)
    assert q.redis.zcard(tombs) == depend.TOMBSTONES
    assert q.redis.zscore(tombs, a) is not None and q.redis.zscore(tombs, "old0") is None
    with pytest.raises(UnknownDependency):
        q.add("c", after=["old0"])
    assert q.get(q.add("d", after=["old1"])).state == "waiting"


def test_graves_are_capped_to_the_newest(redis_url: str, queue_name: str) -> None:
    """The ids of dead jobs the retention dropped (graves) are bounded as tombstones
    are: past the cap the oldest go, the newest stay."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    graves = q.keys.prefix + "graves"
    with q.redis.pipeline(transaction=False) as pipe:
        for start in range(0, depend.TOMBSTONES, 10_000):
            pipe.zadd(graves, {f"old{i}": i for i in range(start, start + 10_000)})
        pipe.execute()
    a = q.add("a", max_attempts=1)

    def die(job: echomq.Job) -> None:
        raise RuntimeError("planned death")

    echomq.Consumer(q, die).run(burst=True)
    assert echomq.scripts.trim_dead(q.redis, q.keys, 0, -1, 100) == 1
    assert q.redis.zcard(graves) == depend.TOMBSTONES
    assert q.redis.zscore(graves, a) is not None and q.redis.zscore(graves, "old0") is None


@pytest.mark.parametrize("state", ["dead", "completed"])
def test_one_purge_or_trim_of_thousands_of_jobs_records_every_id(
        redis_url: str, queue_name: str, state: str) -> None:
    """One call may drop more ids than Lua's unpack takes at once: each is recorded (a
    dead one in graves, a completed one among the tombstones) and the call succeeds."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    n = 5_000
    source = q.keys.dead if state == "dead" else q.keys.completed
    with q.redis.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.hset(q.keys.job(f"j{i}"), mapping={"id": f"j{i}", "name": "x",
                                                    "lane": "default", "state": state})
        pipe.zadd(source, {f"j{i}": i for i in range(n)})
        pipe.execute()
    if state == "dead":
        assert echomq.scripts.trim_dead(q.redis, q.keys, 0, -1, n) == n
    else:
        assert echomq.scripts.purge(q.redis, q.keys, state, n) == (n, 0)
    record = q.keys.prefix + ("graves" if state == "dead" else "tombs")
    assert q.redis.zcard(record) == n and q.redis.zcard(source) == 0
    assert not q.redis.exists(q.keys.job("j0"), q.keys.job(f"j{n - 1}"))


def test_a_group_result_waits_for_every_member_and_fails_with_one(q: echomq.Queue,
                                                                 work: Any) -> None:
    """The group's result record completes only once every member completed, with the
    list in the group's order; a dead member ends it dead (result() raises)."""
    lanes = Lanes(q.redis, q.keys, q.settings)
    wf = echomq.group(work.s(i) for i in range(3)).send()
    record = f"{wf.id}.result"
    assert q.get(record).state == "blocked" and record not in wf.job_ids
    jobs = {j.id: j for j in lanes.claim(3)}
    lanes.settle([Outcome(wf.job_ids[2], jobs[wf.job_ids[2]].token, "c", '"two"'),
                  Outcome(wf.job_ids[0], jobs[wf.job_ids[0]].token, "c", "0")])
    assert q.get(record).state == "blocked"
    lanes.settle([Outcome(wf.job_ids[1], jobs[wf.job_ids[1]].token, "c", "")])
    assert q.get(record).state == "completed"
    assert wf.result(timeout=5) == [0, None, "two"]
    wf2 = echomq.group(work.s(i) for i in range(2)).send()
    jobs = {j.id: j for j in lanes.claim(2)}
    lanes.settle([Outcome(wf2.job_ids[0], jobs[wf2.job_ids[0]].token, "d", "boom")])
    with pytest.raises(echomq.JobFailed):
        wf2.result(timeout=5)


def test_retry_every_dead_job_brings_a_dependency_along(q: echomq.Queue,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Retrying every dead job a batch at a time: a callback that sorts before its dead
    member (same dead time, ids in order) is not left dead because the member falls in a
    later batch; one whose dependency was cancelled stays dead and the batches go on."""
    from echomq.ops import cli as ops_cli
    lanes = Lanes(q.redis, q.keys, q.settings)
    m = q.add("m", job_id="b-member", max_attempts=1)
    q.add("cb", job_id="a-callback", after=[m])
    gone = q.add("g", job_id="0-gone", delay=60)
    q.add("w", job_id="0-waits", after=[gone])
    assert q.cancel(gone)
    late = q.add("z", job_id="z-plain", max_attempts=1)
    for job in lanes.claim(5):
        lanes.settle([Outcome(job.id, job.token, "d", "boom")])
    assert {j: q.get(j).state for j in ("a-callback", "0-waits", late)} == dict.fromkeys(
        ("a-callback", "0-waits", late), "dead")
    monkeypatch.setattr(ops_cli, "RETRY_BATCH", 1)
    data, _ = ops_cli.cmd_retry(q.redis, type("A", (), {"queue": q.name, "job_ids": []})())
    assert data["retried"] == 3
    assert [q.get(j).state for j in (m, "a-callback", late, "0-waits")] == [
        "waiting", "blocked", "waiting", "dead"]


def test_one_retry_all_call_brings_a_dependency_beyond_its_limit(q: echomq.Queue) -> None:
    """The dashboard's retry-all is one call of a limit: a callback within it whose dead
    member lies beyond it waits again for the member, retried in the same call."""
    lanes = Lanes(q.redis, q.keys, q.settings)
    m = q.add("m", job_id="b-member", max_attempts=1)
    q.add("cb", job_id="a-callback", after=[m])
    [job] = lanes.claim(1)
    lanes.settle([Outcome(job.id, job.token, "d", "boom")])
    assert q.redis.zrange(q.keys.dead, 0, 0) == [b"a-callback"]
    assert q.retry_dead(limit=1) == 2
    assert [q.get(j).state for j in (m, "a-callback")] == ["waiting", "blocked"]


def _chain(q: echomq.Queue, first: str, n: int, prefix: str) -> list[Any]:
    """add_many jobs of a chain of n blocked jobs below ``first``."""
    ids = [first, *(f"{prefix}{i}" for i in range(n))]
    return [{"name": "c", "job_id": ids[i + 1], "after": [ids[i]]} for i in range(n)]


def test_a_chain_deeper_than_the_limit_is_refused(q: echomq.Queue, work: Any) -> None:
    """One death ends at most MAX_DEPTH blocked jobs in a row: a deeper chain is refused
    whole, in one batch (several block.lua calls) or grown by a later add."""
    with pytest.raises(ValueError, match="at most 1,000 deep"):
        echomq.chain(*(work.s() for _ in range(depend.MAX_DEPTH + 2))).send()
    assert q.redis.keys(q.keys.prefix + "*") == []
    root = q.add("root", job_id="root")
    q.add_many(_chain(q, root, depend.MAX_DEPTH, "a"))
    assert q.get(f"a{depend.MAX_DEPTH - 1}").state == "blocked"
    before = len(q.redis.keys(q.keys.prefix + "job:*"))
    with pytest.raises(ValueError, match="too deep for it"):
        q.add("c", job_id="over", after=[f"a{depend.MAX_DEPTH - 1}"])
    with pytest.raises(ValueError, match="too deep for it"):  # the batch's own chain counts
        q.add_many(_chain(q, "a1", depend.MAX_DEPTH - 1, "b"))
    assert len(q.redis.keys(q.keys.prefix + "job:*")) == before
    q.add("c", job_id="beside", after=["a0"])  # 2 deep: fine
    assert q.redis.hget(q.keys.job("beside"), "depth") == b"2"


def test_more_dependents_than_the_limit_are_refused(q: echomq.Queue) -> None:
    """One completion releases at most MAX_DEPENDENTS jobs: more waiting for one job is
    refused, in one batch, across the calls of one batch, or by a later add."""
    root = q.add("root", job_id="root")
    over = [{"name": "w", "job_id": f"w{i}", "after": [root]}
            for i in range(depend.MAX_DEPENDENTS + 1)]
    with pytest.raises(ValueError, match="1,001 wait for 'root'"):
        q.add_many(over)
    q.add_many(over[:500])
    before = len(q.redis.keys(q.keys.prefix + "job:*"))
    with pytest.raises(ValueError, match="'root' has that many"):  # two calls: refused whole
        q.add_many([{"name": "w", "job_id": f"v{i}", "after": [root]} for i in range(501)])
    assert len(q.redis.keys(q.keys.prefix + "job:*")) == before
    q.add_many([{"name": "w", "job_id": f"v{i}", "after": [root]} for i in range(500)])
    with pytest.raises(ValueError, match="'root' has that many"):
        q.add("w", after=[root])
    _complete(q)
    assert q.counts()["waiting"] == depend.MAX_DEPENDENTS


def test_block_enforces_the_limits_without_the_batch_totals(
        q: echomq.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """block.lua checks each call itself too (a client that sends no batch totals, a job
    added between the calls of a batch): past either limit it refuses, writing nothing."""
    root = q.add("root", job_id="root")
    q.add_many([{"name": "w", "job_id": f"w{i}", "after": [root]}
                for i in range(depend.MAX_DEPENDENTS)])
    q.add_many(_chain(q, "w0", depend.MAX_DEPTH - 1, "a"))
    monkeypatch.setattr(depend, "limits", lambda jobs: {})
    before = len(q.redis.keys(q.keys.prefix + "job:*"))
    with pytest.raises(ValueError, match="'root' has that many"):
        q.add("w", after=[root])
    with pytest.raises(ValueError, match="too deep for it"):
        q.add("c", after=[f"a{depend.MAX_DEPTH - 2}"])
    assert len(q.redis.keys(q.keys.prefix + "job:*")) == before
