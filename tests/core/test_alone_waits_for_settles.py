"""A job that must run alone (a suspect of a process crash) starts only once every outcome
of the jobs before it is settled: if it kills its process, no sibling's finished work is
lost or run again. The moment a loaded run shows by chance is forced here: one sibling's
settle is held on its way while another's lands, which lets the drain look again."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

import echomq
from echomq.concurrent import ConcurrentDrain


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.02)


def test_a_suspect_does_not_start_while_a_siblings_settle_is_on_its_way(
        redis_url: str, queue_name: str, r: redis.Redis, monkeypatch: Any) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jobs: dict[str, str] = {}  # role -> id
    held, let_go = threading.Event(), threading.Event()
    after_b: list[list[str]] = []  # the jobs in flight once the second settle was read
    real_trip = ConcurrentDrain._round_trip

    async def round_trip(self: ConcurrentDrain, outcomes: Any, *args: Any) -> None:
        """The hook: the settle of job "a" waits on its way until the test lets it go."""
        ids = {o.job_id for o in outcomes}
        if jobs.get("a") in ids:
            held.set()
            await asyncio.get_running_loop().run_in_executor(None, let_go.wait, 20)
        await real_trip(self, outcomes, *args)
        if jobs.get("b") in ids:
            after_b.append([job_id for job_id, _ in self.in_flight])

    monkeypatch.setattr(ConcurrentDrain, "_round_trip", round_trip)
    gates = {"a": threading.Event(), "b": threading.Event()}
    started: list[str] = []

    async def handler(job: echomq.Job) -> None:
        if job.payload.get("fast"):
            return
        started.append(job.id)
        gate = gates.get(job.payload.get("role", ""))
        if gate is not None:
            await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)

    consumer = echomq.Consumer(q, handler, concurrency=3)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        q.add_many([("x", {"fast": True}) for _ in range(8)])  # the buffer opens
        _wait(lambda: q.counts()["completed"] == 8, 10, "the warm-up jobs")
        jobs["a"] = q.add("x", {"role": "a"})
        jobs["b"] = q.add("x", {"role": "b"})
        _wait(lambda: sorted(started) == sorted(jobs.values()), 10, "a and b to run")
        q.pause()  # the suspect's claim is the consumer's alone
        jobs["s"] = suspect = q.add("x", {"role": "s"})
        r.hset(q.keys.job(suspect), "alone", "1")
        q.resume()
        _wait(lambda: q.counts()["active"] == 3, 10, "the suspect to be claimed")
        assert suspect not in started  # it waits for a and b, in the buffer
        gates["a"].set()
        assert held.wait(10), "a's outcome was never sent"
        gates["b"].set()  # b's settle lands while a's is still on its way
        _wait(lambda: bool(after_b), 10, "b's settle to be read")
        assert suspect not in after_b[0], "the suspect started beside an unsettled outcome"
        assert suspect not in started
        let_go.set()
        _wait(lambda: q.get(suspect).state == "completed", 10,  # type: ignore[union-attr]
              "the suspect to run once a's outcome is settled")
        assert q.get(jobs["a"]).state == "completed"  # type: ignore[union-attr]
    finally:
        let_go.set()
        for gate in gates.values():
            gate.set()
        consumer.stop()
        thread.join(10)
