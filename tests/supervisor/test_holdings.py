"""The shared table a child writes and its parent reads, across a real fork."""

from __future__ import annotations

import os
import socket

from echomq.supervisor.holdings import FINISHED, HELD, RUNNING, Holdings, runs_by_mode
from echomq.supervisor.worker import Worker

import echomq
from echomq import scripts
from echomq.job import Claimed
from echomq.lanes import Lanes, Outcome
from echomq.scripts import Settled


def test_the_parent_reads_what_a_forked_child_wrote() -> None:
    table = Holdings(4)
    pid = os.fork()
    if pid == 0:
        table.hold([("a", "1"), ("b", "2"), ("c", "3")])
        table.start("a")
        table.finish("a")
        table.start("b", deadline=123.5, timeout=2.0)
        table.drop(["zzz"])
        os._exit(0)
    os.waitpid(pid, 0)
    held = table.entries()
    assert [(h.job_id, h.token, h.state) for h in held] == [
        ("a", "1", FINISHED), ("b", "2", RUNNING), ("c", "3", HELD)]
    assert held[1].deadline == 123.5 and held[1].timeout == 2.0
    assert table.deadline() == 123.5
    table.close()


def test_dropped_entries_are_reused_and_the_deadline_follows() -> None:
    table = Holdings(2)
    table.hold([("a", "1")])
    table.start("a", deadline=5.0, timeout=1.0)
    table.drop(["a"])
    assert table.entries() == [] and table.deadline() == 0.0
    table.hold([("b", "2"), ("c", "3")])
    assert [h.job_id for h in table.entries()] == ["b", "c"]
    table.close()


def test_release_runs_put_jobs_back_in_claim_order() -> None:
    table = Holdings(8)
    table.hold([(f"j{i}", str(i)) for i in range(6)])
    for j in ("j0", "j1"):
        table.start(j)
        table.finish(j)
    table.start("j2")
    modes = {RUNNING: "stall", FINISHED: "unstarted", HELD: "unstarted"}
    runs = [(mode, [h.job_id for h in run]) for mode, run in runs_by_mode(table.entries(), modes)]
    # later claims go back first; each call keeps its own order at the lane's head
    assert runs == [("unstarted", ["j3", "j4", "j5"]), ("stall", ["j2"]),
                    ("unstarted", ["j0", "j1"])]
    table.close()



def _claimed_twice(q: echomq.Queue) -> tuple[Claimed, Claimed]:
    """One job claimed, its lease run out and reaped, then claimed again: (old, new)."""
    q.add("x", {})
    lanes = Lanes(q.redis, q.keys, q.settings)
    [old] = lanes.claim(1)
    q.redis.zadd(q.keys.leases, {old.id: 0})  # the lease ran out
    assert scripts.reap(q.redis, q.keys)[0] == 1
    [new] = lanes.claim(1)
    assert new.id == old.id and new.token != old.token
    return old, new


def test_a_stale_settle_or_hand_back_keeps_the_same_job_held_under_its_new_token(
        redis_url: str, queue_name: str) -> None:
    # a child that claimed a job again (its old lease was reaped meanwhile) holds it under
    # the new token; the old token's refused settle or hand-back must not drop that holding,
    # or the parent stops extending the new lease and cannot release the job if the child dies
    q = echomq.Queue(queue_name, redis_url=redis_url)
    old, new = _claimed_twice(q)
    parent_end, child_end = socket.socketpair()
    worker = Worker(child_end, queue_name, redis_url, q.settings, lambda job: None, None)
    try:
        worker.on_batch([old])
        worker.on_batch([new])
        worker.after_settle([Outcome(old.id, old.token, "c")], [Settled.STALE])
        assert [h.pair for h in worker.holdings.entries()] == [(new.id, new.token)]
        worker.on_unstarted([(old.id, old.token)])
        assert [h.pair for h in worker.holdings.entries()] == [(new.id, new.token)]
        worker.on_unstarted([(new.id, new.token)])
        assert worker.holdings.entries() == []
    finally:
        worker.holdings.close()
        parent_end.close()
        child_end.close()

    consumer = echomq.Consumer(q, lambda job: None)
    consumer.on_batch([old])
    consumer.on_batch([new])
    consumer.after_settle([Outcome(old.id, old.token, "c")], [Settled.STALE])
    consumer.on_unstarted([(old.id, old.token)])
    assert consumer._held == {new.id: new.token}  # still extended by its heartbeat
    consumer.close()
