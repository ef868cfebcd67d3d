"""The standalone Consumer's prefetch buffer: jobs claimed beyond the concurrency."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

import echomq
import echomq.scripts
from echomq import scripts
from echomq.concurrent import ConcurrentDrain, default_prefetch
from echomq.lanes import Lanes, Outcome


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


def test_a_stop_with_a_full_buffer_hands_it_back_unstarted_and_loses_nothing(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    concurrency = 4
    held = concurrency + default_prefetch(concurrency)
    gate = threading.Event()
    started: list[str] = []

    async def gated(job: echomq.Job) -> None:
        if job.payload.get("fast"):
            return
        started.append(job.id)
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)

    consumer, thread = _warmed_up(q, gated, concurrency)
    ids = q.add_many([("x", {"n": i}) for i in range(10)])
    _wait(lambda: len(started) == concurrency and q.counts()["active"] == held, 10,
          "the slots and the buffer to fill")
    assert len(started) == concurrency  # the buffered jobs have not started
    buffered = set(ids[concurrency:held])
    consumer.stop()
    _wait(lambda: q.counts()["waiting"] == len(ids) - concurrency, 10,
          "the buffered jobs to be handed back")
    gate.set()
    thread.join(10)
    assert not thread.is_alive()
    assert q.counts()["completed"] == concurrency + 8 and q.counts()["active"] == 0
    for job_id in buffered:  # handed back uncharged
        job = q.get(job_id)
        assert job is not None and (job.state, job.attempts, job.stalls) == ("waiting", 0, 0)

    again = echomq.Consumer(q, gated, concurrency=concurrency)
    assert again.run(burst=True) == len(ids) - concurrency
    assert Counter(started) == {j: 1 for j in ids}
    assert q.counts()["completed"] == len(ids) + 8


def test_a_slot_that_frees_up_starts_a_buffered_job_without_a_claim(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    gates: dict[str, threading.Event] = {}
    started: list[str] = []

    async def gated(job: echomq.Job) -> None:
        if job.payload.get("fast"):
            return
        started.append(job.id)
        await asyncio.get_running_loop().run_in_executor(None, gates[job.id].wait, 30)

    consumer, thread = _warmed_up(q, gated, 2)  # two slots, one buffered
    ids = [f"gated-{i}" for i in range(3)]
    gates.update({job_id: threading.Event() for job_id in ids})
    for job_id in ids:
        q.add("x", {}, job_id=job_id)
    try:
        _wait(lambda: len(started) == 2 and q.counts()["active"] == 3, 10,
              "two running, one buffered")
        # the server holds back every write (a claim is one) until unpaused: a job that
        # starts meanwhile came from the buffer
        r.client_pause(10_000, all=False)
        try:
            gates[started[0]].set()
            _wait(lambda: len(started) == 3, 5, "the buffered job to start")
        finally:
            r.client_unpause()
        assert set(started) == set(ids)
    finally:
        for gate in gates.values():
            gate.set()
        consumer.stop()
        thread.join(10)
    assert q.counts()["completed"] == 3 + 8


def test_jobs_that_run_long_are_not_buffered(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    gate = threading.Event()
    started: list[str] = []

    async def slow(job: echomq.Job) -> None:
        if job.payload.get("fast"):  # "fast" here: 0.2 s, so 2 slots finish one in 100 ms
            await asyncio.sleep(0.2)
            return
        started.append(job.id)
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)

    consumer, thread = _warmed_up(q, slow, 2, jobs=2)
    q.add_many([("x", {}) for _ in range(3)])
    try:
        _wait(lambda: len(started) == 2, 10, "two running jobs")
        assert q.counts()["active"] == 2 and q.counts()["waiting"] == 1
    finally:
        gate.set()
        consumer.stop()
        thread.join(10)


def _warmed_up(q: echomq.Queue, handler: Callable[[echomq.Job], Any], concurrency: int,
               jobs: int = 8) -> tuple[echomq.Consumer, threading.Thread]:
    """A running consumer that has run ``jobs`` jobs marked "fast" (the buffer follows the
    run times it has seen), and its thread."""
    consumer = echomq.Consumer(q, handler, concurrency=concurrency)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    q.add_many([("x", {"fast": True}) for _ in range(jobs)])
    _wait(lambda: q.counts()["completed"] == jobs, 10, "the warm-up jobs")
    return consumer, thread


def test_a_job_claimed_again_while_its_old_run_goes_on_is_tracked_as_two_runs(
        redis_url: str, queue_name: str) -> None:
    # the old run's lease was reaped and this consumer claimed the job again: both runs are
    # in flight; the old one ending must not make the drain forget the new one (it would
    # start more jobs than slots, and a stop would leave the new run unsettled)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    gates: dict[int, threading.Event] = {1: threading.Event(), 2: threading.Event()}
    started: list[int] = []

    async def gated(job: echomq.Job) -> None:
        started.append(job.attempts)
        await asyncio.get_running_loop().run_in_executor(None, gates[job.attempts].wait, 30)

    consumer = echomq.Consumer(q, gated, concurrency=2)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        job_id = q.add("x", {})
        _wait(lambda: started == [1], 10, "the first run")
        q.redis.zadd(q.keys.leases, {job_id: 0})  # the first run's lease ran out
        assert scripts.reap(q.redis, q.keys)[0] == 1  # rings: the consumer claims it again
        _wait(lambda: started == [1, 2], 10, "the second run beside the first")
        pool = consumer._pool
        assert pool is not None
        gates[1].set()
        _wait(lambda: pool.mean_run_s is not None, 10, "the first run to end")
        assert len(pool.in_flight) == 1  # the second run is still in flight
    finally:
        gates[2].set()
        gates[1].set()
        consumer.stop()
        thread.join(10)
    assert not thread.is_alive()
    job = q.get(job_id)
    assert job is not None and job.state == "completed"


def test_a_suspect_handed_back_from_the_buffer_unstarted_still_runs_alone_next_time(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    gate = threading.Event()
    started: list[str] = []

    async def gated(job: echomq.Job) -> None:
        if job.payload.get("fast"):
            return
        started.append(job.id)
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)

    consumer, thread = _warmed_up(q, gated, 2)
    running = q.add("x", {"n": 0})
    _wait(lambda: started == [running], 10, "the first job to run")
    # a suspect of a process crash (reap.lua "suspect" marks it so) is claimed beside the
    # running job: it waits in the buffer, unstarted. Admitted while the queue is paused,
    # so the consumer's claim is the only one
    q.pause()
    suspect = q.add("x", {"n": 1})
    r.hset(q.keys.job(suspect), "alone", "1")
    q.resume()
    _wait(lambda: q.counts()["active"] == 2, 10, "the suspect to be buffered")
    assert started == [running]
    consumer.stop()  # hands the buffered suspect back unstarted
    _wait(lambda: q.get(suspect).state == "waiting", 10,  # type: ignore[union-attr]
          "the suspect to be handed back")
    gate.set()
    thread.join(10)
    assert not thread.is_alive()
    # it never ran: which job killed the process is still not known, so it runs alone
    lanes = Lanes(q.redis, q.keys, q.settings)
    [again] = lanes.claim(1)
    assert again.id == suspect and again.alone, "the hand-back dropped the run-alone mark"
    # its lone run ended without a crash (a failure, retried at once): the mark goes
    lanes.settle([Outcome(again.id, again.token, "f", "transient", 0)])
    assert echomq.scripts.promote(q.redis, q.keys, 10)[0] == 1
    [third] = lanes.claim(1)
    assert third.id == suspect and not third.alone


def test_a_poke_while_a_claim_that_comes_back_short_is_on_its_way_is_not_lost(
        redis_url: str, queue_name: str, r: redis.Redis, monkeypatch: Any) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    hold, held, release = threading.Event(), threading.Event(), threading.Event()
    real_execute = ConcurrentDrain._execute

    async def execute(self: ConcurrentDrain, calls: Any, **kw: Any) -> list[Any]:
        """The hook: a claim's reply, once armed, waits until the test lets it go."""
        replies = await real_execute(self, calls, **kw)
        if hold.is_set() and any(script is echomq.scripts.CLAIM for script, _, _ in calls):
            hold.clear()
            held.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
        return replies

    monkeypatch.setattr(ConcurrentDrain, "_execute", execute)
    gate = threading.Event()
    started: list[str] = []

    async def gated(job: echomq.Job) -> None:
        started.append(job.id)
        if job.payload.get("gate"):
            await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)

    consumer = echomq.Consumer(q, gated, concurrency=2)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        first = q.add("x", {"gate": True})
        _wait(lambda: started == [first], 10, "the first job to run")
        hold.set()
        gate.set()  # it finishes: its settle carries a claim for every free slot
        assert held.wait(10), "no claim went out with the settle"
        # the claim found nothing; before its reply is read a job comes and rings
        pool = consumer._pool
        assert pool is not None
        pokes = pool.pokes
        second = q.add("x", {})
        # the poke is counted (a claim of its own may take the job and leave the drain dry
        # again within a millisecond: "not dry" is too brief to be seen)
        _wait(lambda: pool.pokes > pokes, 30, "the ring to poke the drain")
        release.set()
        _wait(lambda: second in started, 10, "the job admitted meanwhile to run")
    finally:
        release.set()
        gate.set()
        consumer.stop()
        thread.join(10)


def test_a_sigterm_while_the_loop_closes_reaches_the_handler_before_it_and_no_closed_fd(
        redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    # asyncio's loop.close() shuts its self-pipe before it stops the signal wakeup fd from
    # writing to it: a SIGTERM in between (a supervisor draining its children) was written
    # to a closed descriptor ("Exception ignored ... Bad file descriptor" on stderr). The
    # drain hands SIGTERM back to the handler it replaced before the loop closes
    monkeypatch.setenv("ECHOMQ_EVENT_LOOP", "asyncio")  # the loop whose close is hooked
    q = echomq.Queue(queue_name, redis_url=redis_url)
    consumer = echomq.Consumer(q, lambda job: None, concurrency=2)  # the drain's hooks
    pool = ConcurrentDrain(consumer.lanes, consumer.runner, consumer, 2)
    before: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: before.append(signum))
    close_self_pipe = pool.loop._close_self_pipe  # type: ignore[attr-defined]

    def close_then_signal() -> None:  # the moment of the race, held open by a hook
        close_self_pipe()
        os.kill(os.getpid(), signal.SIGTERM)

    pool.loop._close_self_pipe = close_then_signal  # type: ignore[attr-defined]
    during: list[int] = []
    try:
        pool.loop.call_soon(pool.stop)
        pool.serve(on_term=lambda: during.append(signal.SIGTERM))
    finally:
        signal.signal(signal.SIGTERM, previous)
        consumer.close()
    assert before == [signal.SIGTERM] and during == []
    assert "Bad file descriptor" not in capfd.readouterr().err
