"""A cancel published while the supervisor's subscription to the stop channel was down (a
cut connection, a Valkey restart) still ends the handler: on subscribing again the
supervisor looks for the jobs its consumers hold that were cancelled meanwhile."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import psutil
import redis

import echomq
from echomq.stopping import channel

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]


def _started(r: redis.Redis, queue: str) -> list[tuple[str, int]]:
    out = []
    for raw in r.lrange(f"ledger:{queue}:started", 0, -1):
        job_id, pid, _ = raw.decode().rsplit(":", 2)
        out.append((job_id, int(pid)))
    return out


def _done(r: redis.Redis, queue: str) -> list[str]:
    return [d.decode() for d in r.lrange(f"ledger:{queue}:done", 0, -1)]


def _subscriber_ids(r: redis.Redis, pid: int) -> list[int]:
    """The server's ids of the pub/sub connections process ``pid`` holds."""
    ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.raddr}
    return [int(c["id"]) for c in r.client_list()
            if int(c.get("sub", 0)) > 0 and int(c["addr"].rsplit(":", 1)[1]) in ports]


def test_a_cancel_missed_while_unsubscribed_still_ends_the_sync_handler(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    jid = q.add("x", {"gate": True}, max_attempts=3)  # blocks in BLPOP for up to 30 s
    wait_until(lambda: len(_started(r, queue_name)) == 1, 10, "the job to start")
    pid = _started(r, queue_name)[0][1]
    wait_until(lambda: bool(_subscriber_ids(r, sup.proc.pid)), 10, "the stop subscription")
    os.kill(sup.proc.pid, signal.SIGSTOP)  # it cannot subscribe again before the cancel
    try:
        for cid in _subscriber_ids(r, sup.proc.pid):
            r.client_kill_filter(_id=cid)
        assert r.pubsub_numsub(channel(q.keys))[0][1] == 0
        assert q.cancel(jid) is True  # published to nobody
    finally:
        os.kill(sup.proc.pid, signal.SIGCONT)
    sup.wait_for_log(rf"job {jid} cancelled while consumer {pid} ran it", timeout=10)
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() ==
               psutil.STATUS_ZOMBIE, 10, "the blocked process to be gone")
    after = q.add("x", {})
    wait_until(lambda: any(s[0] == after for s in _started(r, queue_name)), 10,
               "the respawned consumer to run a job")
    job = q.get(jid)
    assert job is not None and job.state == "cancelled"


def test_a_job_cancelled_while_claimed_ahead_never_runs(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """Fast jobs are claimed a batch ahead (send-ahead): while a slow job of one batch runs,
    the next batch is leased but held by no process yet. A job of it cancelled then must
    not run when its batch comes up."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    warm = q.add_many([("x", {}) for _ in range(1000)])  # the batch size grows past 1
    wait_until(lambda: r.llen(f"ledger:{queue_name}:done") == len(warm), 30, "the warm-up")
    # the first runs alone on waking; the batch after it (the slow job's) runs while the
    # batch after that is claimed ahead
    ids = q.add_many([("x", {}), ("x", {"gate": True})] + [("x", {}) for _ in range(300)])
    wait_until(lambda: any(s[0] == ids[1] for s in _started(r, queue_name)), 10,
               "the slow job to start")
    started = {s[0] for s in _started(r, queue_name)}
    active = [j for j in ids[2:] if q.get(j).state == "active"]  # type: ignore[union-attr]
    assert active and not started & set(active), "no batch was claimed ahead"
    ahead = active[-1]  # the last job leased: in the batch claimed ahead
    assert q.cancel(ahead) is True
    # the cancel ends the one process, the slow job's too: it runs again and waits on the
    # gate again, so the gate holds a token for each run
    r.rpush(f"ledger:{queue_name}:gate", "go", "go")
    others = set(ids) - {ahead}
    wait_until(lambda: others <= set(_done(r, queue_name)), 30,
               "every other job")
    assert ahead not in {s[0] for s in _started(r, queue_name)}
    assert q.get(ahead).state == "cancelled"  # type: ignore[union-attr]
    assert sup.proc.poll() is None
