"""A failure confined to one consumer's own connection: the supervisor's connections stay
healthy, so it sees no outage and pokes nobody. The consumer must reconnect and finish
what it holds by itself: settle what finished, hand back uncharged what it never saw.

Connections go through a TCP proxy (proxy.py) that cuts the consumer's connection at a
chosen command: the supervisor sends neither claims nor settles, so a cut at one of those
is a cut of a consumer's connection.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import redis
from echomq.supervisor.drills.localredis import free_port

import echomq
from echomq import scripts
from echomq.connection import connect
from echomq.job import Claimed
from echomq.lanes import Lanes

from .conftest import Supervisor, wait_until
from .proxy import Proxy, command, script

Start = Callable[..., Supervisor]
MODES = [pytest.param([], id="plain"), pytest.param(["--concurrency", "4"], id="concurrent")]


@pytest.fixture
def proxy(redis_url: str) -> Iterator[Proxy]:
    """A proxy to the session's server."""
    target = urlsplit(redis_url)
    with Proxy(target.port or 6379, target.hostname or "127.0.0.1") as relay:
        yield relay


def _runs(r: redis.Redis, queue: str, job_id: str) -> int:
    started = r.lrange(f"ledger:{queue}:started", 0, -1)
    return sum(1 for x in started if x.decode().startswith(job_id + ":"))


def _start(supervisor: Start, proxy: Proxy, redis_url: str, queue: str, *args: str
           ) -> Supervisor:
    """One consumer, through the proxy, idle once its first claims (on an empty queue)
    are done: the next claim answers the test's add, and nothing pokes the consumer after
    it. Had the add come before, a claim of the start would take the job, and the
    supervisor, having seen work since that poke, would poke the consumer again at its
    IDLE and mend what the test breaks."""
    claims = proxy.watch(script(scripts.CLAIM))
    port = free_port()
    # its handlers write their ledger straight to the server, not through the proxy
    sup = supervisor(proxy.url, queue, "--processes", "1", "--lease-ms", "2000",
                     "--health-port", str(port), *args,
                     env={"ECHOMQ_TEST_LEDGER_URL": redis_url}).started(1)
    assert claims.wait(1, 10), "no first claim of the consumer"

    def idle() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:  # not serving yet
            return False
        return any(line.startswith("echomq_consumers_busy{") and line.endswith(" 0.0")
                   for line in text.splitlines())

    wait_until(idle, 10, "the consumer to say it is idle")
    return sup


@pytest.mark.parametrize("mode", MODES)
def test_a_claim_whose_reply_a_consumer_lost_goes_back_uncharged_without_a_poke(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # the claim of a wake-up leases the job and its reply never arrives: the consumer saw
    # a network error, holds nothing, and no poke comes (the queue is quiet). The job must
    # go back uncharged and run, not wait out its lease and be reaped as a stall (with
    # max_stalls=0 that is dead without ever running)
    q = echomq.Queue(queue_name, redis=r, max_stalls=0)
    _start(supervisor, proxy, redis_url, queue_name, *mode)

    # whichever claim leases the job has its reply dropped
    cut = proxy.cut(script(scripts.CLAIM), when="after", reply=lambda reply: b"lost" in reply)
    q.add("x", {}, job_id="lost")
    assert cut.fired.wait(10), f"no claim of the job went through the proxy: {q.get('lost')}"
    wait_until(lambda: q.get("lost").state in ("completed", "dead"),  # type: ignore[union-attr]
               20, "the job to end")
    job = q.get("lost")
    assert job is not None
    assert (job.state, job.stalls, _runs(r, queue_name, "lost")) == ("completed", 0, 1), (
        f"a job leased by a claim whose reply was lost was charged a stall: {job}")


@pytest.mark.parametrize("mode", MODES)
def test_a_claim_a_dead_consumer_sent_that_runs_after_its_hand_back_leases_nothing(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # the consumer's claim is still on its way to the server when the consumer dies (here
    # SIGKILL; in a drain, a handler's os._exit while the claim sent ahead of its batch is
    # in flight). The supervisor hands back what the consumer held and what its claims
    # record names, and only then does the server run the claim: what it leases would
    # belong to nobody, its lease neither extended nor handed back, and the reap would
    # charge it a stall it never ran (with max_stalls=0: dead, never run). The claim must
    # lease nothing; the job runs once, uncharged, on the consumer started in its place
    q = echomq.Queue(queue_name, redis=r, max_stalls=0)
    sup = _start(supervisor, proxy, redis_url, queue_name, *mode)
    held = proxy.hold(script(scripts.CLAIM))
    if not mode:
        # a consumer parked on the doorbell writes its claim behind each blocking pop: the
        # one behind its next park is held (the pop goes through), and the add's ring
        # returns that pop while the claim is still on its way
        assert held.wait_held(1, 15), "no claim behind a park went through the proxy"
    q.add("x", {}, job_id="late")
    assert held.wait_held(1, 10), f"no claim of the job went through the proxy: {q.get('late')}"
    [child] = psutil.Process(sup.proc.pid).children()
    child.kill()
    sup.wait_for_log(rf"consumer {child.pid} killed by SIGKILL")  # after the hand-back
    held.let_go(1)  # the dead consumer's claim reaches the server now
    assert held.wait_answered(1, 10), "the server did not run the dead consumer's claim"
    held.let_go()  # and the claims of the consumer started in its place
    wait_until(lambda: q.get("late").state in ("completed", "dead"),  # type: ignore[union-attr]
               20, "the job to end")
    job = q.get("late")
    assert job is not None
    assert (job.state, job.stalls, _runs(r, queue_name, "late")) == ("completed", 0, 1), (
        f"a job leased by a dead consumer's late claim was charged a stall: {job}")


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("mode", MODES)
def test_a_settle_a_consumer_could_not_send_is_sent_again_without_a_poke(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str], when: str) -> None:
    # the job ran; its settle never reaches the server ("before"), or its reply is lost
    # ("after"). On a quiet queue nothing pokes the consumer again: it must reconnect and
    # settle by itself, so result() returns (a settle sent twice is refused, not applied)
    q = echomq.Queue(queue_name, redis=r)
    sup = _start(supervisor, proxy, redis_url, queue_name, *mode)
    cut = proxy.cut(script(scripts.SETTLE), when=when)
    job_id = q.add("x", {})
    assert cut.fired.wait(10), "no settle went through the proxy"
    assert q.result(job_id, timeout=10) == "ok"
    job = q.get(job_id)
    assert job is not None
    assert (job.state, job.stalls, _runs(r, queue_name, job_id)) == ("completed", 0, 1), job
    if when == "after":  # sent again and refused: the log must not call the result lost
        sup.wait_for_log("sent again after a lost reply")
        assert "not recorded" not in sup.log, sup.log


@pytest.mark.parametrize("mode", MODES)
def test_a_consumer_whose_connection_is_cut_at_every_settle_keeps_retrying(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # several cuts in a row: the consumer backs off and tries again each time, and the job
    # settles once a settle gets through
    q = echomq.Queue(queue_name, redis=r)
    _start(supervisor, proxy, redis_url, queue_name, *mode)
    cuts = [proxy.cut(script(scripts.SETTLE), nth=n, when="before") for n in (1, 2, 3)]
    job_id = q.add("x", {})
    assert q.result(job_id, timeout=15) == "ok"
    assert all(c.fired.is_set() for c in cuts)
    job = q.get(job_id)
    assert job is not None and (job.state, job.stalls) == ("completed", 0), job
    assert _runs(r, queue_name, job_id) == 1


@pytest.mark.parametrize("nth", [2, 3, 5])
@pytest.mark.parametrize("mode", MODES)
def test_a_busy_consumer_that_loses_a_claims_reply_runs_every_job_once_uncharged(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str], nth: int) -> None:
    # a claim in the middle of a drain (sent ahead of a batch, or beside a settle) loses
    # its reply: the jobs it leased go back uncharged, the outcomes beside it settle once,
    # and every job runs once
    q = echomq.Queue(queue_name, redis=r, max_stalls=0)
    _start(supervisor, proxy, redis_url, queue_name, *mode)
    cut = proxy.cut(script(scripts.CLAIM), nth=nth, when="after",
                    reply=lambda reply: reply != b"*0\r\n")  # one that leased jobs
    ids = q.add_many([("x", {"sleep": 0.01}) for _ in range(40)])
    assert cut.fired.wait(10), "no claim was cut"
    wait_until(lambda: all(q.get(j).state in ("completed", "dead")  # type: ignore[union-attr]
                           for j in ids), 30, "every job to end")
    jobs = [q.get(j) for j in ids]
    assert [(j.id, j.state, j.stalls) for j in jobs if j is not None and  # type: ignore[union-attr]
            (j.state, j.stalls) != ("completed", 0)] == []
    assert {j: _runs(r, queue_name, j) for j in ids} == {j: 1 for j in ids}


class AheadConsumer(echomq.Consumer):
    """A consumer claiming 2 jobs at a time ahead, with a claims record (as a supervised
    consumer has), that stops once ``stop_after`` jobs have run."""

    def __init__(self, *args: Any, stop_after: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drainer.send_ahead = True
        self.lanes.claimer = "ahead"
        self.stop_after = stop_after
        self.runs: Counter[str] = Counter()
        self.batches: list[list[str]] = []

    def batch_size(self) -> int:
        return 2

    def stop_requested(self) -> bool:
        return super().stop_requested() or sum(self.runs.values()) >= self.stop_after

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        super().on_batch(batch)
        self.batches.append([c.id for c in batch])


def test_a_lost_reply_to_a_request_read_before_a_crash_suspect_costs_its_jobs_no_wait(
        proxy: Proxy, queue_name: str, r: redis.Redis, caplog: pytest.LogCaptureFixture
        ) -> None:
    # claims take 2 jobs: [j0], ahead [j1, j2], behind it settle j0 + claim [j3, ...], behind
    # that settle j1, j2 + claim the next. j3 is a crash suspect: before it runs, the request
    # in flight is read, and its reply is lost. The drain goes on; what that request leased
    # must go back (and run here, first in its lane) while the drain goes on, not stay
    # leased and unseen until it ends (on a busy queue, never)
    q = echomq.Queue(queue_name, redis=r)
    ids = [q.add("x", {"n": i}, job_id=f"j{i}") for i in range(20)]
    lanes = Lanes(r, q.keys, q.settings)
    claimed = lanes.claim(100)
    lanes.release([(c.id, c.token) for c in claimed[4:]], "unstarted")
    lanes.release([(c.id, c.token) for c in claimed[3:4]], "suspect")
    lanes.release([(c.id, c.token) for c in claimed[:3]], "unstarted")
    client = redis.Redis.from_url(proxy.url)
    scripts.load_all(client, q.keys.prefix)
    consumer: AheadConsumer

    def handler(job: echomq.Job) -> None:
        consumer.runs.update([job.id])

    consumer = AheadConsumer(echomq.Queue(queue_name, redis=client), handler, stop_after=12)
    cut = proxy.cut(script(scripts.CLAIM), nth=4, when="after")
    try:
        with caplog.at_level("WARNING", logger="echomq.drain"):
            consumer._drainer.run()
    finally:
        consumer.close()
    assert cut.fired.is_set()
    assert consumer.batches[:3] == [["j0"], ["j1", "j2"], ["j3", "j4"]], consumer.batches
    unseen = [c.id for c in claimed[5:7]]  # what the lost request claimed
    assert {j: consumer.runs[j] for j in unseen} == {j: 1 for j in unseen}, (
        "jobs a lost reply leased stayed leased, unseen, while the drain went on: "
        f"ran {sorted(consumer.runs)}")
    for j in unseen:
        job = q.get(j)
        assert job is not None and (job.state, job.attempts, job.stalls) == (
            "completed", 1, 0), job
    assert max(consumer.runs.values()) == 1 and len(ids) == 20
    # the settle of j1 and j2 went out with the lost request and landed: sent again, it is
    # refused, and the log must not say their results were not recorded
    said = [rec.getMessage() for rec in caplog.records]
    assert not [m for m in said if "not recorded" in m], said


@pytest.mark.parametrize("mode", MODES)
def test_a_stop_while_a_consumer_retries_a_settle_ends_with_the_job_settled(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # the supervisor is told to stop while its consumer is backing off between failed
    # settles: the consumer stops retrying to drain, settles what it holds and exits
    q = echomq.Queue(queue_name, redis=r)
    sup = _start(supervisor, proxy, redis_url, queue_name, *mode)
    cuts = [proxy.cut(script(scripts.SETTLE), nth=n, when="before") for n in (1, 2, 3)]
    job_id = q.add("x", {})
    assert cuts[1].fired.wait(10), "the consumer did not try to settle again"
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    job = q.get(job_id)
    assert job is not None and (job.state, job.stalls) == ("completed", 0), job
    assert _runs(r, queue_name, job_id) == 1


def test_a_request_sent_ahead_that_fails_on_its_way_costs_what_it_claimed_no_wait(
        proxy: Proxy, queue_name: str, r: redis.Redis) -> None:
    # the claim of [j1, j2] sent ahead while j0 runs reaches the server, and the write
    # fails (a hook drops its connection and raises, as a send that broke part way): the
    # drain goes on, its next claim (with j0's settle) comes back empty. [j1, j2] must go
    # back, and run, before the drain ends, not stay leased with nobody to run them
    q = echomq.Queue(queue_name, redis=r)
    ids = [q.add("x", {"n": i}, job_id=f"j{i}") for i in range(3)]
    client = redis.Redis.from_url(proxy.url)
    scripts.load_all(client, q.keys.prefix)
    consumer: AheadConsumer

    def handler(job: echomq.Job) -> None:
        consumer.runs.update([job.id])

    consumer = AheadConsumer(echomq.Queue(queue_name, redis=client), handler, stop_after=10)
    send_ahead = consumer.lanes.send_ahead

    def broken_on_its_way(outcomes: Any, count: int) -> Any:
        consumer.lanes.send_ahead = send_ahead  # once
        ahead = send_ahead(outcomes, count)
        wait_until(lambda: {b"j1", b"j2"} <= set(r.zrange(q.keys.leases, 0, -1)), 10,
                   "the claim sent ahead to run")
        ahead.drop()
        raise redis.ConnectionError("the connection broke while the request went out")

    consumer.lanes.send_ahead = broken_on_its_way  # type: ignore[method-assign]
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert consumer.lanes.send_ahead == send_ahead, "nothing was sent ahead"
    for j in ids:
        job = q.get(j)
        assert job is not None and (job.state, job.stalls, consumer.runs[j]) == (
            "completed", 0, 1), (job, consumer.runs)


def test_a_hand_back_of_unseen_claims_that_fails_ends_the_drain_to_be_tried_again(
        proxy: Proxy, queue_name: str, r: redis.Redis) -> None:
    # as above, the reply of the request read before the suspect j3 runs is lost, and then
    # the hand-back of what it leased fails too (its read of the claims record is cut).
    # The drain must not go on as if it had landed: sending ahead, it never comes back to
    # that point before it ends, so on a busy queue those jobs stay leased and unseen
    # (and, once later claims push them off the claims record, are reaped as stalls). It
    # ends instead, and the consumer's retry hands them back first
    q = echomq.Queue(queue_name, redis=r)
    for i in range(20):
        q.add("x", {"n": i}, job_id=f"j{i}")
    lanes = Lanes(r, q.keys, q.settings)
    claimed = lanes.claim(100)
    lanes.release([(c.id, c.token) for c in claimed[4:]], "unstarted")
    lanes.release([(c.id, c.token) for c in claimed[3:4]], "suspect")
    lanes.release([(c.id, c.token) for c in claimed[:3]], "unstarted")
    client = connect(proxy.url)  # no retries of its own, as a consumer's
    scripts.load_all(client, q.keys.prefix)
    consumer: AheadConsumer

    def handler(job: echomq.Job) -> None:
        consumer.runs.update([job.id])

    consumer = AheadConsumer(echomq.Queue(queue_name, redis=client), handler, stop_after=12)
    lost = proxy.cut(script(scripts.CLAIM), nth=4, when="after")
    unread = proxy.cut(command("LRANGE"), when="before")
    failures = 0
    try:
        while True:  # as a supervised consumer does, after a backoff
            try:
                consumer._drainer.run()
                break
            except redis.ConnectionError:
                failures += 1
                assert failures < 5
    finally:
        consumer.close()
    assert lost.fired.is_set() and unread.fired.is_set()
    unseen = [c.id for c in claimed[5:7]]  # what the lost request claimed
    assert {j: consumer.runs[j] for j in unseen} == {j: 1 for j in unseen}, (
        "jobs a lost reply leased stayed leased, unseen, after their hand-back failed: "
        f"ran {sorted(consumer.runs)}")
    for j in unseen:
        job = q.get(j)
        assert job is not None and (job.state, job.attempts, job.stalls) == (
            "completed", 1, 0), job
    assert max(consumer.runs.values()) == 1


@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_a_standalone_consumer_stopped_while_its_settle_fails_settles_when_it_answers(
        proxy: Proxy, queue_name: str, r: redis.Redis, concurrency: str) -> None:
    # a standalone consumer is told to stop while a job runs; the job finishes and its
    # settle is cut on its way. The connection mends at once: the outcome must be settled
    # within the drain timeout, not left with its lease to expire, the job reaped as a
    # stall and run again
    q = echomq.Queue(queue_name, redis=r)
    gate = f"gate:{queue_name}"
    job_id = q.add("x", {"gate": gate}, job_id="held")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, str(root / "tests" / "core" / "standalone_proc.py"), proxy.url,
         queue_name, "--concurrency", concurrency, "--drain-timeout", "20"],
        env={**os.environ, "PYTHONPATH": str(root)}, cwd=root, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        lines.extend(line.rstrip("\n") for line in proc.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: _runs(r, queue_name, job_id) == 1, 30, "the job to start")
        cut = proxy.cut(script(scripts.SETTLE), when="before")
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: any("stopping" in line for line in lines), 10, "the stop")
        r.rpush(gate, "go")  # the job ends; its settle is cut
        proc.wait(40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
    out = "\n".join(lines)
    assert cut.fired.is_set(), out
    assert proc.returncode == 0, out
    job = q.get(job_id)
    assert job is not None and (job.state, job.stalls) == ("completed", 0), (job, out)
    assert _runs(r, queue_name, job_id) == 1
    assert r.zcard(q.keys.leases) == 0, out
