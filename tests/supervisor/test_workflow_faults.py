"""A chord under the real supervisor: a member's consumer process SIGKILLed mid-job, or
a member whose lease lapsed and that ran twice; the callback runs exactly once."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import redis

import echomq
from echomq import depend

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


def _started(r: redis.Redis, queue: str) -> list[tuple[str, int]]:
    out = []
    for raw in r.lrange(f"ledger:{queue}:started", 0, -1):
        job_id, pid, _ = raw.decode().rsplit(":", 2)
        out.append((job_id, int(pid)))
    return out


def test_chord_callback_runs_once_when_a_member_process_is_killed(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "2", "--beat-ms", "100").started(2)
    members = q.add_many([("m", {}, {"job_id": f"m{i}"}) for i in range(6)]
                         + [("m", {"gate": True}, {"job_id": "victim"})])
    callback = q.add("callback", {"deps": True}, job_id="cb", after=members)
    wait_until(lambda: "victim" in dict(_started(r, queue_name)), 15, "the victim to start")
    pid = dict(_started(r, queue_name))["victim"]
    os.kill(pid, signal.SIGKILL)  # mid-job: it waits on its gate
    sup.wait_for_log(rf"consumer {pid} killed by SIGKILL")
    r.rpush(f"ledger:{queue_name}:gate", 1)  # its second run passes the gate at once
    # read by the callback in its consumer process: every member's result, in order
    assert q.result(callback, timeout=30) == {m: "ok" for m in members}
    assert list(q.result(callback)) == members
    started = [j for j, _ in _started(r, queue_name)]
    assert started.count("victim") == 2 and started.count("cb") == 1
    assert r.lrange(f"ledger:{queue_name}:done", 0, -1).count(b"cb") == 1
    assert depend.read_results(q.redis, q.keys, callback) == {m: "ok" for m in members}
    assert q.counts()["blocked"] == 0 and q.counts()["completed"] == 8


def test_chord_callback_runs_once_when_a_member_runs_twice(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """A member's lease is taken from it (a reap hands it to another consumer) while its
    first run is stopped; both runs finish, the first one's settle is stale."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "2", "--beat-ms", "100").started(2)
    members = q.add_many([("m", {}, {"job_id": f"m{i}"}) for i in range(4)]
                         + [("m", {"gate": True}, {"job_id": "twice"})])
    callback = q.add("callback", {}, job_id="cb", after=members)
    # the other members are settled while "twice" waits on its gate, even when one
    # claim took them in one batch with it (a finished outcome waits for no slow job)
    wait_until(lambda: "twice" in dict(_started(r, queue_name))
               and all(q.get(f"m{i}").state == "completed" for i in range(4)), 15,
               "the other members to complete")
    pid = dict(_started(r, queue_name))["twice"]
    os.kill(pid, signal.SIGSTOP)
    try:
        # as a reap of a lapsed lease: back to its lane with the stall charged
        token = q.redis.hget(q.keys.job("twice"), "token").decode()
        assert echomq.scripts.release(q.redis, q.keys, [("twice", token)], "stall") == (1, 0)
        # the stopped run's BLPOP still waits at the server and takes one: two go
        r.rpush(f"ledger:{queue_name}:gate", 1, 1)
        wait_until(lambda: q.get(callback).state == "completed", 60, "the callback")
    finally:
        os.kill(pid, signal.SIGCONT)
    # the first run finishes too, and its settle comes late: stale
    wait_until(lambda: r.lrange(f"ledger:{queue_name}:done", 0, -1).count(b"twice") == 2,
               20, "the first run to finish")
    sup.stop()
    started = [j for j, _ in _started(r, queue_name)]
    assert started.count("twice") == 2 and started.count("cb") == 1
    assert q.get("twice").stalls == 1 and q.counts()["completed"] == 6
