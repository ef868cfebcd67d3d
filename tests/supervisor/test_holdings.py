"""The shared table a child writes and its parent reads, across a real fork."""

from __future__ import annotations

import os

from echomq.supervisor.holdings import FINISHED, HELD, RUNNING, Holdings, runs_by_mode


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

