"""The synchronous drain's send-ahead (echomq/drain.py): a request is in flight while the
jobs in hand run; once a batch has run, its settle and the next claim are written before
the reply holding the next batch is read.

Interleavings are forced with hooks (a consumer or worker subclass, a handler acting at a
precise moment), a paused server (SIGSTOP) or a forked consumer killed at a known point;
claims take a fixed number of jobs (the runner's sizing needs a warm-up), so that a batch
is sent ahead where the tests expect it. Every queue here has one lane, so jobs are
claimed in the order they were added: with batches of 2, ``run()`` claims [j0], runs
it, sends ahead the claim of [j1, j2], writes the settle of j0 with the claim of [j3, j4]
behind it, reads [j1, j2], runs j1 and j2, writes their settle with the claim of [j5, j6], reads
[j3, j4], and so on.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis
from echomq.supervisor import protocol
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.children import Child
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.settings import QueueSpec, Settings
from echomq.supervisor.worker import Worker

import echomq
from echomq import scripts
from echomq.concurrent import max_held
from echomq.connection import ServerRefused, client_from_url
from echomq.early import EarlySettle
from echomq.job import Claimed
from echomq.lanes import Ahead, Lanes, Outcome

# --- helpers ---------------------------------------------------------------------------


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


def _add(q: echomq.Queue, n: int) -> list[str]:
    """``n`` jobs j0..j(n-1) on one lane (claimed in this order)."""
    return [q.add("x", {"n": i}, job_id=f"j{i}") for i in range(n)]


def _leased(r: redis.Redis, q: echomq.Queue) -> set[str]:
    return {x.decode() for x in r.zrange(q.keys.leases, 0, -1)}


def _state(q: echomq.Queue, job_id: str) -> tuple[str, int, int]:
    job = q.get(job_id)
    assert job is not None
    return job.state, job.attempts, job.stalls


def _waiting_order(r: redis.Redis, q: echomq.Queue) -> list[str]:
    """The waiting jobs in the order the next claims would take them (claims them)."""
    return [c.id for c in Lanes(r, q.keys, q.settings).claim(100)]


def _in_use(client: redis.Redis) -> int:
    """Connections checked out of the client's pool (none once a drain returned)."""
    return len(client.connection_pool._in_use_connections)  # type: ignore[attr-defined]


def _mark_alone(r: redis.Redis, q: echomq.Queue, alone_id: str) -> None:
    """Make ``alone_id`` a crash suspect (reap.lua's "suspect" mode: it runs alone until it
    settles) without changing the claim order or any job's attempts."""
    lanes = Lanes(r, q.keys, q.settings)
    claimed = lanes.claim(100)
    cut = [c.id for c in claimed].index(alone_id)
    # each release goes in front of the one before: the last jobs first
    lanes.release([(c.id, c.token) for c in claimed[cut + 1:]], "unstarted")
    lanes.release([(c.id, c.token) for c in claimed[cut:cut + 1]], "suspect")
    lanes.release([(c.id, c.token) for c in claimed[:cut]], "unstarted")


class Probe(echomq.Consumer):
    """A standalone consumer whose claims take ``size`` jobs, recording each batch it
    holds; ``batch_hook(n)`` runs when the n-th batch is held, before the drain sends
    anything ahead for it. A standalone consumer sends nothing ahead (it keeps no claims
    record); ``ahead=True`` turns it on, to drive the drain's send-ahead paths alone."""

    def __init__(self, *args: Any, size: int = 2, ahead: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # off in a standalone consumer; asked for here, on where a supervised one has it
        self._drainer.send_ahead = ahead and self.lanes.can_send_ahead()
        self.size = size
        self.batches: list[list[str]] = []
        self.batch_hook: Callable[[int], None] | None = None
        self.settled: list[tuple[str, scripts.Settled]] = []  # (job id, code), in order

    def batch_size(self) -> int:
        return self.size

    def after_settle(self, outcomes: Sequence[Any], codes: Sequence[scripts.Settled]) -> None:
        super().after_settle(outcomes, codes)
        self.settled += [(o.job_id, code) for o, code in zip(outcomes, codes, strict=True)]

    def on_batch(self, batch: Sequence[Claimed]) -> None:
        super().on_batch(batch)
        self.batches.append([c.id for c in batch])
        if self.batch_hook is not None:
            self.batch_hook(len(self.batches))


class ProbeWorker(Worker):
    """A supervisor's consumer (run in-process or forked) whose claims take 2 jobs."""

    def batch_size(self) -> int:
        return 2


class Supervised:
    """A :class:`ProbeWorker` run in this process beside an Arbiter that has it as the
    child of its queue's first slot, so the supervisor's lease pass (run by hand, as its
    timer would) reads its holdings and claims record."""

    def __init__(self, redis_url: str, queue: str, lease_ms: int,
                 handler: Callable[[echomq.Job], Any]) -> None:
        claimer = os.urandom(8).hex()
        self.arbiter = Arbiter(Settings(redis_url=redis_url, lease_ms=lease_ms, queues=(
            QueueSpec(queue, "echomq.supervisor.drills.handler:handle"),)))
        self.rt = self.arbiter.queues[queue]
        self.parent_end, self.child_end = socket.socketpair()
        self.worker = ProbeWorker(self.child_end, queue, redis_url, self.rt.settings, handler,
                                  None, claimer=claimer)
        self.record = self.worker.lanes.keys.claims(claimer)
        self.rt.slots[0].child = Child(
            queue=queue, slot=0, pid=os.getpid(), sock=self.parent_end,
            reader=protocol.LineReader(self.parent_end.fileno()),
            holdings=self.worker.holdings, claimer=claimer)

    def held(self) -> set[str]:
        """The ids its holdings table lists."""
        return {h.job_id for h in self.worker.holdings.entries()}

    def drain(self) -> None:
        """One drain (as a poke would have it run), then everything closed."""
        try:
            self.worker.drain.run()
        finally:
            self.rt.slots[0].child = None
            self.rt.metronome.doorbell.reset()
            self.arbiter.client.close()
            self.worker.holdings.close()
            self.worker.client.close()
            self.parent_end.close()
            self.child_end.close()


def _private_probe(server: LocalRedis, queue: str, jobs: int, **client_options: Any
                   ) -> tuple[redis.Redis, redis.Redis, echomq.Queue, list[str], Counter[str],
                              Probe]:
    """A consumer claiming ahead on a server of the test's own, with a claims record:
    (its client, an admin client, the queue, the job ids, runs per job, the consumer)."""
    client = client_from_url(server.url, **client_options)
    admin = redis.Redis.from_url(server.url)
    q = echomq.Queue(queue, redis=client)
    scripts.load_all(client, q.keys.prefix)
    ids = _add(q, jobs)
    runs: Counter[str] = Counter()
    consumer = Probe(q, lambda job: runs.update([job.id]), ahead=True)
    consumer.lanes.claimer = "probe"
    return client, admin, q, ids, runs, consumer


def _fork_worker(redis_url: str, queue: str, settings: echomq.QueueSettings,
                 handler: Callable[[echomq.Job], Any], claimer: str
                 ) -> tuple[int, Holdings, socket.socket]:
    """Fork a supervisor's consumer that drains once (as a poke would have it do), with
    its holdings table shared like the supervisor's: (pid, holdings, the parent's end)."""
    holdings = Holdings(max_held(settings.concurrency, settings.claim_batch))
    parent_end, child_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            parent_end.close()
            worker = ProbeWorker(child_end, queue, redis_url, settings, handler, None, None,
                                 holdings, claimer)
            worker.drain.run()
        except BaseException:  # noqa: BLE001 - reported by the exit code
            code = 1
        finally:
            os._exit(code)
    child_end.close()
    return pid, holdings, parent_end


def _wait_exit(pid: int, timeout: float = 20.0) -> int:
    status: list[int] = []

    def gone() -> bool:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            status.append(st)
        return bool(status)

    try:
        _wait(gone, timeout, f"consumer {pid} to exit")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return status[0]


def _hand_back_as_the_supervisor(redis_url: str, queue: str, pid: int, holdings: Holdings,
                                 sock: socket.socket, claimer: str) -> None:
    """What the supervisor does when a consumer died: hand back what it held (charged by
    state) and what its claims record names that it never held."""
    settings = Settings(redis_url=redis_url, queues=(
        QueueSpec(queue, "echomq.supervisor.drills.handler:handle"),))
    arbiter = Arbiter(settings)
    rt = arbiter.queues[queue]
    child = Child(queue=queue, slot=0, pid=pid, sock=sock,
                  reader=protocol.LineReader(sock.fileno()), holdings=holdings,
                  claimer=claimer)
    try:
        arbiter.releases.release_child(rt, child)
    finally:
        rt.metronome.doorbell.reset()
        arbiter.client.close()
        sock.close()


def _arbiter_settings(redis_url: str, queue: str) -> echomq.QueueSettings:
    settings = Settings(redis_url=redis_url, queues=(
        QueueSpec(queue, "echomq.supervisor.drills.handler:handle"),))
    arbiter = Arbiter(settings)
    try:
        return arbiter.queues[queue].settings
    finally:
        arbiter.queues[queue].metronome.doorbell.reset()
        arbiter.client.close()


# === findings: each of these fails on the change =========================================


def test_a_standalone_consumer_holds_every_job_it_leased_while_one_runs(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # the consumer's heartbeat extends only the leases it holds (_held): a standalone
    # consumer claims nothing ahead, so nothing it leased goes unextended
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = _add(q, 6)
    unheld: dict[str, set[str]] = {}

    def handler(job: echomq.Job) -> None:
        unheld[job.id] = _leased(r, q) - set(consumer._held)

    consumer = Probe(q, handler)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert sorted(unheld) == ids
    assert {j: s for j, s in unheld.items() if s} == {}, (
        "jobs leased to this consumer but not held (their leases not extended) while a job "
        "of the batch before them ran")


def test_the_job_claimed_on_waking_starts_before_anything_is_claimed_ahead(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # a pickup: the job a wake-up claims alone starts with no request written after its
    # claim (writing the claim of the next batch first delayed every pickup); the
    # pipeline starts once it has run, with the same requests in the same order
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = _add(q, 5)
    leased: dict[str, set[str]] = {}

    def handler(job: echomq.Job) -> None:
        leased[job.id] = _leased(r, q)

    sup = Supervised(redis_url, queue_name, 30_000, handler)
    sup.drain()
    assert leased["j0"] == {"j0"}
    assert leased["j1"] >= {"j1", "j2", "j3", "j4"}  # then [j3, j4] went behind [j1, j2]
    assert [j for j in ids if _state(q, j)[0] == "completed"] == ids


def test_a_long_job_costs_the_jobs_a_supervised_consumer_claimed_after_it_no_stall(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # a supervised consumer's jobs claimed ahead are leased before it holds them; j1 (of
    # the batch [j1, j2], with [j3, j4] claimed behind it) runs for more than two leases
    # meanwhile. The supervisor's extension pass (run here as its timer would) extends
    # what the child's claims record names beyond its holdings, so a reaper finds nothing
    # expired: j3 and j4 run once, with no stall
    lease_ms = 1000
    q = echomq.Queue(queue_name, redis_url=redis_url, lease_ms=lease_ms)
    ids = _add(q, 5)
    runs: Counter[str] = Counter()
    claimed_ahead: set[str] = set()
    tick = threading.Event()

    def handler(job: echomq.Job) -> None:
        runs[job.id] += 1
        if job.id != "j1":
            return
        claimed_ahead.update(_leased(r, q) - sup.held())
        until = time.monotonic() + 2.5 * lease_ms / 1000
        while time.monotonic() < until:  # the supervisor's timer, every third of a lease
            sup.arbiter.leases.extend(time.monotonic())
            scripts.reap(r, q.keys)  # another consumer's reaper
            tick.wait(lease_ms / 3000)

    sup = Supervised(redis_url, queue_name, lease_ms, handler)
    sup.drain()
    assert claimed_ahead == {"j3", "j4"}
    assert {j: (runs[j], *_state(q, j)) for j in ids} == {
        j: (1, "completed", 1, 0) for j in ids}


def test_a_long_job_costs_the_jobs_claimed_after_it_no_stall_and_no_second_run(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # j0 runs longer than a lease (the heartbeat keeps its own lease); the jobs claimed
    # ahead meanwhile are not extended: a reaper (another consumer's, the supervisor's)
    # charges them a stall and hands them out again, and this consumer then runs them
    # with their dead tokens and once more under new ones
    q = echomq.Queue(queue_name, redis_url=redis_url, lease_ms=1000)
    ids = _add(q, 5)
    runs: Counter[str] = Counter()

    def handler(job: echomq.Job) -> None:
        runs[job.id] += 1
        if job.id != "j0" or runs[job.id] > 1:
            return
        not_extended = _leased(r, q) - set(consumer._held)

        def reaped() -> bool:
            scripts.reap(r, q.keys)
            return not not_extended & _leased(r, q)

        _wait(reaped, 15, f"the leases of {sorted(not_extended)} to expire and be reaped")

    consumer = Probe(q, handler)
    try:
        consumer.run(burst=True)
    finally:
        consumer.close()
    # (runs, state, attempts, stalls)
    assert {j: (runs[j], *_state(q, j)) for j in ids} == {
        j: (1, "completed", 1, 0) for j in ids}


@pytest.mark.parametrize("why", ["alone", "slow"])
def test_a_batch_not_sent_ahead_starts_only_once_the_batch_before_it_is_settled(
        redis_url: str, queue_name: str, r: redis.Redis, why: str) -> None:
    # the batch [j3, j4] was claimed ahead while [j1, j2] ran; it is not sent ahead in turn
    # (j3 is a crash suspect that must run alone, or the jobs turned slow), so j1 and j2's
    # outcomes are carried into it and stay unsettled while j3 (and j4) run: a crash of
    # the suspect (what it is suspected of) or any end of the process meanwhile runs j1 and
    # j2 again. Before the change they were settled with the claim of [j3, j4].
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = _add(q, 6)
    if why == "alone":
        _mark_alone(r, q, "j3")
        assert r.hget(q.keys.job("j3"), "alone") == b"1"
    unsettled: dict[str, set[str]] = {}

    def handler(job: echomq.Job) -> None:
        if job.id == "j3":
            unsettled[job.id] = _leased(r, q) & {"j0", "j1", "j2"}
        if why == "slow" and job.id == "j2":
            consumer.size = 1  # the jobs got slow: claims take one at a time from now on

    consumer = Probe(q, handler, ahead=True)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert consumer.batches[:2] == [["j0"], ["j1", "j2"]]
    assert unsettled == {"j3": set()}, "finished jobs left unsettled while j3 ran"
    assert {j: _state(q, j) for j in ids} == {j: ("completed", 1, 0) for j in ids}


def test_a_crash_suspect_that_kills_its_process_again_costs_the_batch_before_it_nothing(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # j3 is a suspect (it ran beside a crash); it crashes its process again. The jobs of
    # the batch before it finished long before: they must not run again. The supervisor
    # hands back a dead child's finished-but-unsettled jobs as unstarted.
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 5)
    _mark_alone(r, q, "j3")

    def handler(job: echomq.Job) -> None:
        if job.id == "j3":
            os.kill(os.getpid(), signal.SIGKILL)

    claimer = os.urandom(8).hex()
    pid, holdings, sock = _fork_worker(redis_url, queue_name,
                                       _arbiter_settings(redis_url, queue_name), handler,
                                       claimer)
    status = _wait_exit(pid)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    _hand_back_as_the_supervisor(redis_url, queue_name, pid, holdings, sock, claimer)
    assert _state(q, "j0")[0] == "completed"
    assert {j: _state(q, j)[0] for j in ("j1", "j2")} == {"j1": "completed",
                                                          "j2": "completed"}, (
        "jobs that finished before the suspect started go back to run again")


def test_a_handler_can_use_the_consumers_client_with_a_pool_of_one_connection(
        redis_url: str, queue_name: str) -> None:
    # a bounded pool the consumer shares with its handlers: the request sent ahead keeps
    # a connection checked out for the whole batch, so a handler's progress() (or a
    # follow-up add(), the heartbeat, the early settle) finds none free ("Too many
    # connections"; a BlockingConnectionPool without a timeout waits forever)
    pool = redis.ConnectionPool.from_url(redis_url, max_connections=1)
    client = redis.Redis(connection_pool=pool)
    q = echomq.Queue(queue_name, redis=client)
    ids = _add(q, 5)

    def handler(job: echomq.Job) -> None:
        job.progress({"at": job.id})

    consumer = Probe(q, handler, ahead=True)
    assert not consumer._drainer.send_ahead  # no room in the pool: nothing is sent ahead
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert {j: _state(q, j) for j in ids} == {j: ("completed", 1, 0) for j in ids}
    client.close()


def test_a_standalone_consumer_killed_mid_batch_costs_the_jobs_beyond_its_batch_nothing(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # a standalone consumer has no claims record: what it leased when it died comes back
    # when the lease expires, charged a stall. Jobs beyond the batch in hand were not
    # leased before the change; claimed ahead, they are now charged too (a job with a
    # stall already goes dead at its second, never having run)
    q = echomq.Queue(queue_name, redis_url=redis_url, lease_ms=300)
    _add(q, 6)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the consumer's process
        code = 0
        try:
            def handler(job: echomq.Job) -> None:
                if job.id == "j1":
                    os.write(ready_w, b"x")
                    threading.Event().wait()  # until killed

            consumer = Probe(echomq.Queue(queue_name, redis_url=redis_url, lease_ms=300),
                             handler)
            consumer._drainer.run()
        except BaseException:  # noqa: BLE001 - reported by the exit code
            code = 1
        finally:
            os._exit(code)
    try:
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"x"
        os.kill(pid, signal.SIGKILL)
    finally:
        _wait_exit(pid)
        os.close(ready_r)

    def reaped() -> bool:
        scripts.reap(r, q.keys)
        return not _leased(r, q)

    _wait(reaped, 10, "the dead consumer's leases to expire and be reaped")
    assert _state(q, "j1") == ("waiting", 1, 1)  # it was running: its stall is earned
    assert {j: _state(q, j) for j in ("j3", "j4", "j5")} == {
        j: ("waiting", 0, 0) for j in ("j3", "j4", "j5")}


def test_a_keyboard_interrupt_costs_the_jobs_beyond_the_batch_in_hand_nothing(
        redis_url: str, queue_name: str) -> None:
    # Ctrl-C in a handler: the consumer hands back what it holds with "requeue", which
    # keeps the attempt their claim counted. Jobs beyond the batch in hand were not
    # claimed before the change; claimed ahead, they now come back with an attempt spent
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 6)

    def handler(job: echomq.Job) -> None:
        if job.id == "j1":
            raise KeyboardInterrupt

    consumer = Probe(q, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            consumer.run(burst=True)
    finally:
        consumer.close()
    assert {j: _state(q, j) for j in ("j3", "j4", "j5")} == {
        j: ("waiting", 0, 0) for j in ("j3", "j4", "j5")}


# === intended behaviour that holds: these pass ==========================================


def test_a_drain_runs_every_job_once_in_order_and_leaves_no_connection_checked_out(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    # loaded, as a worker's boot does: a call refused NOSCRIPT with a request written
    # behind it is run again on a second connection
    scripts.load_all(q.redis, q.keys.prefix)
    ids = _add(q, 9)
    runs: list[str] = []
    consumer = Probe(q, lambda job: runs.append(job.id), ahead=True)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert runs == ids
    assert consumer.batches == [["j0"], ["j1", "j2"], ["j3", "j4"], ["j5", "j6"], ["j7", "j8"]]
    assert consumer.settled == [(j, scripts.Settled.COMPLETED) for j in ids]  # each once
    assert {j: _state(q, j) for j in ids} == {j: ("completed", 1, 0) for j in ids}
    assert consumer._held == {} and consumer._drainer.pending == []
    client = consumer.queue.redis
    assert _in_use(client) == 0
    assert len(client.connection_pool._available_connections) == 1  # type: ignore[attr-defined]


def test_a_handler_using_the_consumers_client_reads_its_own_replies_with_requests_in_flight(
        redis_url: str, queue_name: str) -> None:
    # the connection a request was written on stays out of the pool until its last reply
    # is read: a handler's own call on the consumer's client (progress, a lookup) while
    # the settle-and-claim written behind runs must not take that connection and read
    # the drain's reply as its own
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = _add(q, 9)
    seen: dict[str, Any] = {}

    def handler(job: echomq.Job) -> None:
        job.progress({"at": job.id})
        found = q.get(job.id)
        seen[job.id] = found.payload if found is not None else None

    consumer = Probe(q, handler, ahead=True)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert seen == {j: {"n": int(j[1:])} for j in ids}
    assert {j: _state(q, j) for j in ids} == {j: ("completed", 1, 0) for j in ids}
    assert _in_use(consumer.queue.redis) == 0


def test_a_stop_mid_batch_hands_back_the_rest_and_the_jobs_claimed_ahead_unstarted_in_order(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 6)
    runs: list[str] = []

    def handler(job: echomq.Job) -> None:
        runs.append(job.id)
        if job.id == "j1":  # [j3, j4] went out ahead before j1 started
            consumer.stop()

    consumer = Probe(q, handler, ahead=True)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert runs == ["j0", "j1"]
    assert consumer.batches == [["j0"], ["j1", "j2"], ["j3", "j4"]]
    assert {j: _state(q, j) for j in ("j0", "j1", "j2", "j3", "j4")} == {
        "j0": ("completed", 1, 0), "j1": ("completed", 1, 0),
        "j2": ("waiting", 0, 0), "j3": ("waiting", 0, 0), "j4": ("waiting", 0, 0)}
    assert consumer._held == {} and consumer._drainer.pending == []
    assert _in_use(consumer.queue.redis) == 0
    assert _waiting_order(r, q) == ["j2", "j3", "j4", "j5"]


def test_a_stop_before_a_batch_sends_nothing_ahead(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 6)
    runs: list[str] = []

    def handler(job: echomq.Job) -> None:
        runs.append(job.id)
        if job.id == "j2":  # the last job of its batch: [j3, j4] is read, then the stop
            consumer.stop()

    consumer = Probe(q, handler, ahead=True)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert runs == ["j0", "j1", "j2"]
    assert {j: _state(q, j) for j in ("j3", "j4", "j5")} == {
        j: ("waiting", 0, 0) for j in ("j3", "j4", "j5")}
    assert _leased(r, q) == set() and _in_use(consumer.queue.redis) == 0
    assert _waiting_order(r, q) == ["j3", "j4", "j5"]


def test_a_lost_reply_to_the_request_sent_ahead_keeps_the_outcomes_and_costs_nothing(
        private_redis: LocalRedis, queue_name: str, caplog: pytest.LogCaptureFixture) -> None:
    # the server is frozen once j0's settle (sent with the claim of [j3, j4]) has run;
    # [j3, j4] is read from what was in the socket, and the settle of [j1, j2] (with the
    # claim of [j5]) goes out frozen; [j3, j4] runs, its settle is written behind, and the
    # read of the frozen request times out. The server then runs both with nobody reading
    # the replies. The next run settles what was kept (refused as stale: it ran) and hands
    # back, through the claims record, the job the unseen claim leased
    client, admin, q, ids, runs, consumer = _private_probe(private_redis, queue_name, 6,
                                                           socket_timeout=0.5)

    def freeze(n: int) -> None:
        if n == 2:
            _wait(lambda: _state(q, "j0")[0] == "completed", 10, "j0's settle")
            private_redis.pause()

    consumer.batch_hook = freeze
    pool = client.connection_pool
    taken: list[Any] = []
    returned: list[Any] = []
    get_connection, release = pool.get_connection, pool.release

    def counted_get(*args: Any, **kwargs: Any) -> Any:
        taken.append(get_connection(*args, **kwargs))
        return taken[-1]

    def counted_release(conn: Any) -> None:
        returned.append(conn)
        release(conn)

    pool.get_connection, pool.release = counted_get, counted_release  # type: ignore[method-assign]
    try:
        with pytest.raises(redis.exceptions.TimeoutError):
            consumer._drainer.run()
        assert [o.job_id for o in consumer._drainer.pending] == ["j1", "j2", "j3", "j4"]
        assert _in_use(client) == 0
        # each connection went back once: a second return would hand it out while in use
        assert len(returned) == len(taken)
        consumer.batch_hook = None
        private_redis.resume()
        _wait(lambda: _state(q, "j4")[0] == "completed" and "j5" in _leased(admin, q), 10,
              "the frozen requests to run once the server goes on")
        with caplog.at_level("WARNING", logger="echomq.drain"):
            consumer._drainer.run()
    finally:
        private_redis.resume()
        consumer.close()
    assert runs == {j: 1 for j in ids}
    assert {j: _state(q, j) for j in ids} == {j: ("completed", 1, 0) for j in ids}
    assert consumer._drainer.pending == [] and consumer._held == {}
    assert _in_use(client) == 0
    # the outcomes sent again are refused (they were recorded): no log says they were not
    said = [rec.getMessage() for rec in caplog.records]
    assert not [m for m in said if "not recorded" in m], said
    assert sum("sent again after a lost reply" in m for m in said) == 4, said


def test_a_refusal_of_the_request_sent_ahead_keeps_the_outcomes_for_the_next_run(
        private_redis: LocalRedis, queue_name: str) -> None:
    # under OOM the claim can run while the settle beside it is refused (with one lane its
    # first write is an LPOP, which is not refused): its jobs come back only through the
    # claims record, as with a refused settle-and-claim before the change
    client, admin, q, ids, runs, consumer = _private_probe(private_redis, queue_name, 6)

    def out_of_memory(n: int) -> None:
        if n == 2:  # j0's settle went out before [j1, j2] were read: let it land first
            _wait(lambda: _state(q, "j0")[0] == "completed", 10, "j0's settle")
            admin.config_set("maxmemory", 1)  # noeviction: every write is refused

    consumer.batch_hook = out_of_memory
    try:
        with pytest.raises(ServerRefused):
            consumer._drainer.run()
        # refused: the settle of [j1, j2] (read while [j3, j4] ran) and, written behind it
        # and dropped unread, that of [j3, j4]
        assert [o.job_id for o in consumer._drainer.pending] == ["j1", "j2", "j3", "j4"]
        assert _in_use(client) == 0
        admin.config_set("maxmemory", 0)
        consumer.batch_hook = None
        consumer._drainer.run()
    finally:
        consumer.close()
    assert runs == {j: 1 for j in ids}
    assert {j: _state(q, j) for j in ids} == {j: ("completed", 1, 0) for j in ids}
    assert _in_use(client) == 0


def test_a_script_flush_before_the_request_sent_ahead_is_run_again_after_loading(
        private_redis: LocalRedis, queue_name: str) -> None:
    client = client_from_url(private_redis.url)
    admin = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis=client)
    scripts.load_all(client, q.keys.prefix)
    ids = _add(q, 9)
    runs: list[str] = []
    consumer = Probe(q, lambda job: runs.append(job.id), ahead=True)
    consumer.batch_hook = lambda n: admin.script_flush() if n in (2, 4) else None
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert runs == ids
    assert {j: _state(q, j) for j in ids} == {j: ("completed", 1, 0) for j in ids}
    assert _in_use(client) == 0


def test_a_handler_raising_keyboard_interrupt_leaves_every_leased_job_held(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # the reply of what was sent ahead is read on the way out: the batch before is settled
    # and the jobs claimed ahead are held, for the owner to hand back
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 6)

    def handler(job: echomq.Job) -> None:
        if job.id == "j1":
            raise KeyboardInterrupt

    consumer = Probe(q, handler, ahead=True)
    try:
        with pytest.raises(KeyboardInterrupt):
            consumer._drainer.run()
        assert _state(q, "j0") == ("completed", 1, 0)
        assert set(consumer._held) == _leased(r, q) == {"j1", "j2", "j3", "j4"}
        assert _in_use(consumer.queue.redis) == 0
    finally:
        consumer.close()


def test_a_consumer_killed_with_a_reply_unread_gets_everything_handed_back_in_order(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # killed while j1 runs: j0's settle and the claim of [j3, j4] went out, unread. The
    # supervisor's hand-back: j1 (running) charged a stall, j2 (held) and j3, j4 (claimed,
    # never held: the claims record) back unstarted, in claim order; j0 stays completed
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 6)
    ready_r, ready_w = os.pipe()

    def handler(job: echomq.Job) -> None:
        if job.id == "j1":
            os.write(ready_w, b"x")
            threading.Event().wait()  # until killed

    claimer = os.urandom(8).hex()
    pid, holdings, sock = _fork_worker(redis_url, queue_name,
                                       _arbiter_settings(redis_url, queue_name), handler,
                                       claimer)
    try:
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"x"
        # what went out ahead ran (the settle, then the claim), its reply unread
        _wait(lambda: _state(q, "j0")[0] == "completed" and {"j3", "j4"} <= _leased(r, q),
              10, "the request sent ahead to run")
        assert {h.job_id for h in holdings.entries()} == {"j0", "j1", "j2"}
        os.kill(pid, signal.SIGKILL)
    finally:
        _wait_exit(pid)
        os.close(ready_r)
    _hand_back_as_the_supervisor(redis_url, queue_name, pid, holdings, sock, claimer)
    assert {j: _state(q, j) for j in ("j0", "j1", "j2", "j3", "j4")} == {
        "j0": ("completed", 1, 0), "j1": ("waiting", 1, 1), "j2": ("waiting", 0, 0),
        "j3": ("waiting", 0, 0), "j4": ("waiting", 0, 0)}
    assert _leased(r, q) == set()
    assert _waiting_order(r, q) == ["j1", "j2", "j3", "j4", "j5"]


def test_a_consumer_killed_with_two_requests_unread_loses_no_outcome_and_runs_nothing_twice(
        redis_url: str, queue_name: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    # the one moment two requests are in flight: [j1, j2] ran, their settle (with the claim
    # of [j5, j6]) is written behind the request that claimed [j3, j4], and the consumer is
    # killed before reading either. Both run; the supervisor's hand-back finds j1 and j2
    # settled (not run again) and hands back j3..j6, never held, unstarted and in order
    q = echomq.Queue(queue_name, redis_url=redis_url)
    scripts.load_all(r, q.keys.prefix)  # as the worker's boot does: no request is NOSCRIPT
    _add(q, 8)
    write_behind = Lanes.send_behind

    def write_and_die(self: Lanes, ahead: Ahead, outcomes: Sequence[Any], count: int) -> Ahead:
        written = write_behind(self, ahead, outcomes, count)
        if [o.job_id for o in outcomes] == ["j1", "j2"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    # inherited by the forked consumer only
    monkeypatch.setattr(Lanes, "send_behind", write_and_die)
    claimer = os.urandom(8).hex()
    pid, holdings, sock = _fork_worker(redis_url, queue_name,
                                       _arbiter_settings(redis_url, queue_name),
                                       lambda job: None, claimer)
    status = _wait_exit(pid)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    _wait(lambda: {"j5", "j6"} <= _leased(r, q), 10, "the request written behind to run")
    assert {h.job_id for h in holdings.entries()} == {"j0", "j1", "j2"}
    _hand_back_as_the_supervisor(redis_url, queue_name, pid, holdings, sock, claimer)
    assert {j: _state(q, j) for j in ("j0", "j1", "j2", "j3", "j4", "j5", "j6")} == {
        "j0": ("completed", 1, 0), "j1": ("completed", 1, 0), "j2": ("completed", 1, 0),
        "j3": ("waiting", 0, 0), "j4": ("waiting", 0, 0),
        "j5": ("waiting", 0, 0), "j6": ("waiting", 0, 0)}
    assert _leased(r, q) == set()
    assert _waiting_order(r, q) == ["j3", "j4", "j5", "j6", "j7"]


def test_a_crash_suspect_read_behind_a_flushed_settle_costs_the_batch_before_it_nothing(
        private_redis: LocalRedis, queue_name: str) -> None:
    # [j1, j2] ran and their settle went out written behind the request claiming [j3, j4];
    # the scripts are flushed meanwhile, so that settle is refused NOSCRIPT and runs only
    # when its reply is read. j3, read from the request before it, is a suspect and kills
    # its process again: it must not start before the settle of j1 and j2 has landed
    url = private_redis.url
    admin = redis.Redis.from_url(url)
    q = echomq.Queue(queue_name, redis_url=url)
    scripts.load_all(admin, q.keys.prefix)
    _add(q, 6)
    _mark_alone(admin, q, "j3")

    def handler(job: echomq.Job) -> None:
        if job.id == "j2":  # the claim of [j3, j4] has run; every script is lost now
            _wait(lambda: {"j3", "j4"} <= _leased(admin, q), 10, "the claim of [j3, j4]")
            admin.script_flush()
        if job.id == "j3":
            os.kill(os.getpid(), signal.SIGKILL)

    claimer = os.urandom(8).hex()
    pid, holdings, sock = _fork_worker(url, queue_name, _arbiter_settings(url, queue_name),
                                       handler, claimer)
    status = _wait_exit(pid)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    _hand_back_as_the_supervisor(url, queue_name, pid, holdings, sock, claimer)
    assert {j: _state(q, j)[0] for j in ("j0", "j1", "j2")} == {
        "j0": "completed", "j1": "completed", "j2": "completed"}, (
        "jobs that finished before the suspect started go back to run again")


def test_a_health_checked_connection_reads_its_replies_in_order_with_a_request_behind(
        private_redis: LocalRedis, queue_name: str) -> None:
    # redis-py checks a connection idle past its health_check_interval with a PING before
    # the next command; on a connection with a reply unread, that PING would read the reply
    # as its own: the request written behind must go out unchecked
    client = client_from_url(private_redis.url + "?health_check_interval=1")
    q = echomq.Queue(queue_name, redis=client)
    scripts.load_all(client, q.keys.prefix)
    ids = _add(q, 6)
    runs: Counter[str] = Counter()

    def handler(job: echomq.Job) -> None:
        runs[job.id] += 1
        if job.id == "j1":  # [j1, j2] outlasts the interval
            time.sleep(1.2)

    consumer = Probe(q, handler, ahead=True)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert runs == {j: 1 for j in ids}
    assert consumer.settled == [(j, scripts.Settled.COMPLETED) for j in ids]
    assert _in_use(client) == 0


def test_finished_outcomes_settle_early_under_a_long_job_with_a_time_limit(
        redis_url: str, queue_name: str) -> None:
    # j2 has a time limit: past half of it, j1's outcome (finished in the same batch) is
    # settled while j2 runs; j0's went out ahead before the batch started
    q = echomq.Queue(queue_name, redis_url=redis_url)
    scripts.load_all(q.redis, q.keys.prefix)  # as a supervisor's consumer does at its start
    for i in range(5):
        q.add("x", {"n": i}, job_id=f"j{i}", timeout=0.4 if i == 2 else None)
    seen: dict[str, str] = {}

    def handler(job: echomq.Job) -> None:
        if job.id == "j2":
            seen["j0"] = _state(q, "j0")[0]
            _wait(lambda: _state(q, "j1")[0] == "completed", 10, "j1 to settle early")

    consumer = Probe(q, handler, ahead=True)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert seen == {"j0": "completed"}
    assert {f"j{i}": _state(q, f"j{i}") for i in range(5)} == {
        f"j{i}": ("completed", 1, 0) for i in range(5)}


@pytest.mark.parametrize("ahead", [True, False])
def test_finished_outcomes_settle_while_a_long_job_without_a_time_limit_runs(
        redis_url: str, queue_name: str, ahead: bool) -> None:
    # j2 has no time limit and waits on a gate: j1's outcome, finished in the same batch,
    # is recorded while j2 runs (its result is readable, its dependents released), not
    # held until j2 returns; a crash of j2's process would otherwise run j1 again
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 5)
    seen: dict[str, str] = {}

    def handler(job: echomq.Job) -> None:
        if job.id == "j2":  # runs until j1's outcome is recorded (or fails the job)
            _wait(lambda: _state(q, "j1")[0] == "completed", 10, "j1 to settle early")
            seen["j1"] = _state(q, "j1")[0]

    consumer = Probe(q, handler, ahead=ahead)
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert seen == {"j1": "completed"}
    assert {f"j{i}": _state(q, f"j{i}") for i in range(5)} == {
        f"j{i}": ("completed", 1, 0) for i in range(5)}
    assert consumer.settled.count(("j1", scripts.Settled.COMPLETED)) == 1


def test_send_ahead_is_off_where_the_worker_must_not_claim_past_a_limit(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    for max_jobs, expected in ((None, True), (5, False)):
        parent_end, child_end = socket.socketpair()
        worker = Worker(child_end, queue_name, redis_url, q.settings, lambda job: None,
                        max_jobs)
        try:
            assert worker.drain.send_ahead is expected
        finally:
            worker.holdings.close()
            worker.client.close()
            parent_end.close()
            child_end.close()


def test_jobs_claimed_ahead_keep_their_leases_under_a_job_that_outlives_the_claims_record(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # A supervised consumer sends the claim of [j3, j4] behind the batch [j1, j2], then
    # runs j1, a job longer than ten leases (a slow job among fast ones: the batch size
    # was measured on the fast ones). The supervisor extends j3 and j4 only through the
    # child's claims record, and that record expires ten leases after the child's last
    # claim (claim.lua's PEXPIRE) unless the supervisor's pass renews it. Were it gone,
    # nobody would extend their leases: a reaper would charge them a stall they did not
    # earn and hand them out again, and this consumer, once j1 ends, would run them under
    # their dead tokens and then once more.
    lease_ms = 200
    q = echomq.Queue(queue_name, redis_url=redis_url, lease_ms=lease_ms)
    ids = _add(q, 5)
    runs: Counter[str] = Counter()
    claimed_ahead: set[str] = set()
    tick = threading.Event()

    def timer_pass() -> None:
        """The supervisor's extension timer, and another consumer's reaper."""
        sup.arbiter.leases.extend(time.monotonic())
        scripts.reap(r, q.keys)
        tick.wait(lease_ms / 3000)  # the timer's period: a third of a lease

    def handler(job: echomq.Job) -> None:
        runs[job.id] += 1
        if job.id != "j1" or runs[job.id] > 1:
            return
        claimed_ahead.update(_leased(r, q) - sup.held())
        until = time.monotonic() + 13 * lease_ms / 1000
        while time.monotonic() < until:  # j1 runs on, past the record's first life
            timer_pass()
        assert r.exists(sup.record), "the claims record expired under a long job"

    sup = Supervised(redis_url, queue_name, lease_ms, handler)
    sup.drain()
    assert claimed_ahead == {"j3", "j4"}
    # (runs, state, attempts, stalls)
    assert {j: (runs[j], *_state(q, j)) for j in ids} == {
        j: (1, "completed", 1, 0) for j in ids}


@pytest.mark.parametrize("retries_early", [True, False])
def test_early_settles_stop_at_a_retry_where_retries_are_written_through(
        redis_url: str, queue_name: str, retries_early: bool) -> None:
    # durability "sync": a retry's settle is followed by its write-through to the floor
    # before the next job starts, so a batch's early settles stop at the first retry;
    # elsewhere a retry settles beside the batch like any outcome. [j0] runs alone, then
    # [j1 ok, j2 retried, j3 ok, j4 long]: j4 waits for j1's early settle
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 5)
    seen: dict[str, str] = {}

    def handler(job: echomq.Job) -> None:
        if job.id == "j2" and job.attempts == 1:
            raise RuntimeError("retry me")
        if job.id == "j4":
            _wait(lambda: _state(q, "j1")[0] == "completed", 10, "j1 to settle early")
            seen["j2"] = _state(q, "j2")[0]

    consumer = Probe(q, handler, size=4)
    consumer._drainer.retries_early = retries_early
    try:
        consumer._drainer.run()
    finally:
        consumer.close()
    assert consumer.batches[:2] == [["j0"], ["j1", "j2", "j3", "j4"]]
    assert seen == {"j2": "scheduled" if retries_early else "active"}
    assert _state(q, "j2")[:2] == ("scheduled", 1)


def test_a_hook_failing_on_early_settled_outcomes_keeps_the_later_ones(
        redis_url: str, queue_name: str) -> None:
    # the owner's hook for outcomes the batch's thread settled fails (a write-through that
    # could not read the server): the drain stops, and what finished after them is kept
    # and settled first by the next call, not dropped with its jobs left leased
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 3)
    failed: list[str] = []

    class Failing(Probe):
        def after_settle(self, outcomes: Sequence[Any], codes: Sequence[scripts.Settled]
                         ) -> None:
            super().after_settle(outcomes, codes)
            if not failed and any(o.job_id == "j1" for o in outcomes):
                failed.append("j1")
                raise redis.ConnectionError("the server went away")

    def handler(job: echomq.Job) -> None:
        if job.id == "j2":
            _wait(lambda: _state(q, "j1")[0] == "completed", 10, "j1 to settle early")

    consumer = Failing(q, handler, size=2)
    try:
        with pytest.raises(redis.ConnectionError):
            consumer._drainer.run()
        assert [o.job_id for o in consumer._drainer.pending] == ["j2"]
        assert _state(q, "j2")[0] == "active"
        consumer._drainer.run()
    finally:
        consumer.close()
    assert {f"j{i}": _state(q, f"j{i}") for i in range(3)} == {
        f"j{i}": ("completed", 1, 0) for i in range(3)}


class _EndsOnce(BaseException):
    """Raised out of the settler thread, as a gevent Timeout or a SystemExit would be."""


class _SettleEndingOnce(Lanes):
    ended = False

    def settle(self, outcomes: Sequence[Outcome]) -> list[scripts.Settled]:
        if not self.ended:
            self.ended = True
            raise _EndsOnce
        return super().settle(outcomes)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_settler_thread_ended_by_a_base_exception_neither_hangs_the_disarm_nor_the_next(
        redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    _add(q, 2)
    claimed = Lanes(q.redis, q.keys, q.settings).claim(2)
    early = EarlySettle(_SettleEndingOnce(q.redis, q.keys, q.settings))
    early.arm([Outcome(claimed[0].id, claimed[0].token, "c", "null", 0)], 0.01)
    ended = early.thread
    assert ended is not None
    ended.join(10)
    assert not ended.is_alive()
    done: list[tuple[int, list[scripts.Settled]]] = []
    waiter = threading.Thread(target=lambda: done.append(early.disarm()), daemon=True)
    waiter.start()
    waiter.join(10)
    assert done == [(0, [])]  # nothing settled early: the batch settles it, as usual
    assert _state(q, "j0")[0] == "active"
    early.arm([Outcome(c.id, c.token, "c", "null", 0) for c in claimed], 0.01)
    _wait(lambda: all(_state(q, c.id)[0] == "completed" for c in claimed), 10,
          "a new settler thread to settle the next arm's outcomes")
    assert early.thread is not ended and early.disarm()[0] == 2
