"""Handlers the supervisor tests run in real forked consumers.

Each records into Redis lists under ``ledger:<queue>:*`` (URL from
ECHOMQ_TEST_LEDGER_URL) so tests count executions from evidence.
"""

from __future__ import annotations

import os
import time

import redis

_client: redis.Redis | None = None
GATE_SLICE_S, GATE_SLICES = 3, 10  # a gate's BLPOPs: redis-py ends a read after 5 s
_pid = 0


def _ledger() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client = redis.Redis.from_url(os.environ["ECHOMQ_TEST_LEDGER_URL"])
        _pid = os.getpid()
    return _client


def _gate(queue: str, gate: object) -> str:
    """The list a gated job waits on: the queue's, or (a string) one of its own."""
    return f"ledger:{queue}:gate" + (f":{gate}" if isinstance(gate, str) else "")


def record(job) -> str:  # type: ignore[no-untyped-def]
    """Payload options: sleep (s), exit (code, via os._exit), exit_first (the same on attempt
    1 only), stamp (push start time), gate (wait until the test pushes onto
    ``ledger:<queue>:gate``, or ``ledger:<queue>:gate:<name>`` for a string, at most
    30 s), pause_writes (ms: the server postpones every
    write for that long, from the job's return on; the job records no "done"), deps (return
    ``job.dependency_results()``)."""
    r = _ledger()
    p = job.payload if isinstance(job.payload, dict) else {}
    r.rpush(f"ledger:{job.queue}:started", f"{job.id}:{os.getpid()}:{job.attempts}")
    if p.get("stamp"):
        r.rpush(f"ledger:{job.queue}:stamps", repr(time.time()))
    if p.get("fail_first") and job.attempts == 1:
        raise RuntimeError("first attempt fails")
    if p.get("pause_writes"):
        r.execute_command("CLIENT", "PAUSE", int(p["pause_writes"]), "WRITE")
        return "paused"
    if "exit" in p:
        os._exit(int(p["exit"]))
    if p.get("gate"):
        # in slices under the client's 5 s read timeout, 30 s in all
        for _ in range(GATE_SLICES):
            if r.blpop([_gate(job.queue, p["gate"])], GATE_SLICE_S):
                break
    if "exit_first" in p and job.attempts == 1:
        os._exit(int(p["exit_first"]))
    if p.get("sleep"):
        time.sleep(float(p["sleep"]))  # simulated work inside the job
    r.rpush(f"ledger:{job.queue}:done", job.id)
    if p.get("deps"):
        return job.dependency_results()  # a workflow's callback: what its members returned
    return "ok"


_aclient: object = None
_apid = 0


async def record_async(job) -> str:  # type: ignore[no-untyped-def]
    """The async twin of :func:`record`: sleep and gate wait without blocking the loop;
    ``block`` (s) blocks the loop with ``time.sleep``, as a faulty handler would."""
    import asyncio

    import redis.asyncio

    global _aclient, _apid
    if _aclient is None or _apid != os.getpid():
        _aclient = redis.asyncio.Redis.from_url(os.environ["ECHOMQ_TEST_LEDGER_URL"])
        _apid = os.getpid()
    r = _aclient
    p = job.payload if isinstance(job.payload, dict) else {}
    await r.rpush(f"ledger:{job.queue}:started",  # type: ignore[attr-defined]
                  f"{job.id}:{os.getpid()}:{job.attempts}")
    if p.get("gate"):
        for _ in range(GATE_SLICES):
            if await r.blpop([_gate(job.queue, p["gate"])],  # type: ignore[attr-defined]
                             GATE_SLICE_S):
                break
    if p.get("sleep"):
        await asyncio.sleep(float(p["sleep"]))
    if p.get("block"):
        time.sleep(float(p["block"]))  # a handler that wrongly blocks its event loop
    await r.rpush(f"ledger:{job.queue}:done", job.id)  # type: ignore[attr-defined]
    return "ok"


async def record_loop(job) -> str:  # type: ignore[no-untyped-def]
    """Push the module of the event loop this async handler runs on."""
    import asyncio

    loop_module = type(asyncio.get_running_loop()).__module__
    _ledger().rpush(f"ledger:{job.queue}:loops", loop_module)
    return loop_module
