"""A second review of the send-ahead drain (echomq/drain.py) and the scripts' bulk paths
(claim.lua, settle.lua, admit.lua): each test here fails on the reviewed code.

Interleavings are forced with hooks (a worker subclass whose claims take two jobs, a
handler acting at a precise moment); the supervisor's lease extension and a reaper are
run by hand, as their timers would run them. See tests/core/test_send_ahead.py for the
first review's tests, which these do not repeat.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

import redis
from echomq.supervisor import protocol
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.children import Child
from echomq.supervisor.settings import QueueSpec, Settings
from echomq.supervisor.worker import Worker

import echomq
from echomq import scripts
from echomq.lanes import Lanes

# --- helpers (as in tests/core/test_send_ahead.py) -------------------------------------


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


class ProbeWorker(Worker):
    """A supervisor's consumer (run in-process) whose claims take 2 jobs."""

    def batch_size(self) -> int:
        return 2


# === findings ============================================================================


def test_jobs_claimed_ahead_keep_their_leases_under_a_job_that_outlives_the_claims_record(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # A supervised consumer sends the claim of [j1, j2] ahead, then runs j0, a job longer
    # than ten leases (a slow job among fast ones: the batch size was measured on the fast
    # ones). The supervisor extends j1 and j2 only through the child's claims record, and
    # that record expires ten leases after the child's last claim (claim.lua's PEXPIRE)
    # unless the supervisor's pass renews it. Were it gone, nobody would extend their
    # leases: a reaper would charge them a stall they did not earn and hand them out
    # again, and this consumer, once j0 ends, would run them under their dead tokens and
    # then once more.
    lease_ms = 200
    q = echomq.Queue(queue_name, redis_url=redis_url, lease_ms=lease_ms)
    ids = _add(q, 5)
    claimer = os.urandom(8).hex()
    record = q.keys.claims(claimer)
    arbiter = Arbiter(Settings(redis_url=redis_url, lease_ms=lease_ms, queues=(
        QueueSpec(queue_name, "echomq.supervisor.drill_handler:handle"),)))
    rt = arbiter.queues[queue_name]
    runs: Counter[str] = Counter()
    claimed_ahead: set[str] = set()
    tick = threading.Event()

    def timer_pass() -> None:
        """The supervisor's extension timer, and another consumer's reaper."""
        arbiter._extend_leases()
        scripts.reap(r, q.keys)
        tick.wait(lease_ms / 3000)  # the timer's period: a third of a lease

    def handler(job: echomq.Job) -> None:
        runs[job.id] += 1
        if job.id != "j0" or runs[job.id] > 1:
            return
        claimed_ahead.update(_leased(r, q) - {h.job_id for h in worker.holdings.entries()})
        until = time.monotonic() + 13 * lease_ms / 1000
        while time.monotonic() < until:  # j0 runs on, past the record's first life
            timer_pass()
        assert r.exists(record), "the claims record expired under a long job"

    parent_end, child_end = socket.socketpair()
    worker = ProbeWorker(child_end, queue_name, redis_url, rt.settings, handler, None,
                         claimer=claimer)
    rt.slots[0].child = Child(queue=queue_name, slot=0, pid=os.getpid(), sock=parent_end,
                              reader=protocol.LineReader(parent_end.fileno()),
                              holdings=worker.holdings, claimer=claimer)
    try:
        worker.drain.run()
    finally:
        rt.slots[0].child = None
        rt.metronome.doorbell.reset()
        arbiter.client.close()
        worker.holdings.close()
        worker.client.close()
        parent_end.close()
        child_end.close()
    assert claimed_ahead == {"j1", "j2"}
    # (runs, state, attempts, stalls)
    assert {j: (runs[j], *_state(q, j)) for j in ids} == {
        j: (1, "completed", 1, 0) for j in ids}


def test_a_claim_of_thousands_of_jobs_with_a_claims_record_hands_them_out(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    # claim.lua slices its leases ("unpack takes a few thousand values at most") but still
    # appends the whole claim to the claimer's record with one unpack: a supervised
    # consumer's claim of 4,000 jobs or more (claim_batch, or concurrency from ~2,700 with
    # its prefetch) fails with "too many results to unpack" after it popped the ids,
    # marked them active and leased them. The consumer gets an error, nobody holds them,
    # and no record names them for the supervisor to hand back: they wait out their
    # leases and are charged a stall without having run (dead at the second).
    q = echomq.Queue(queue_name, redis_url=redis_url, claim_batch=4500)
    n = 4500
    ids = q.add_many([("x", i) for i in range(n)])
    lanes = Lanes(r, q.keys, q.settings)
    lanes.claimer = "probe"
    try:
        claimed = lanes.claim(n)
    except redis.exceptions.ResponseError as exc:
        stranded = len(_leased(r, q))
        raise AssertionError(f"the claim failed ({exc}), leaving {stranded} jobs leased to "
                             "nobody") from None
    assert [c.id for c in claimed] == ids
    assert r.zcard(q.keys.leases) == n
    record = r.lrange(q.keys.claims("probe"), 0, -1)
    assert len(record) == 2 * min(n, lanes.claims_kept)
    assert record[-2].decode() == ids[-1]
