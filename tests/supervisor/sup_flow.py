"""A handler for the flow-control tests: a ledger of starts and ends on the server.

Each run pushes "start <lane> <seq> <id> <t> <active> <started_ms>" and then
"end <lane> <seq> <id> <t>" onto ``ledger:<queue>:flow``; ``active`` is the
lane's running count of executions (a counter the handler keeps on the server,
so two runs of one lane at once show as 2), ``started_ms`` the claim's server
time from the job hash.
"""

from __future__ import annotations

import time

from sup_jobs import _ledger  # type: ignore[import-not-found]  # same directory on the path


def ledger(job) -> str:  # type: ignore[no-untyped-def]
    """Payload: seq (the job's place in its lane's admit order), sleep (s), fail_first."""
    r = _ledger()
    p = job.payload if isinstance(job.payload, dict) else {}
    key = f"ledger:{job.queue}:flow"
    active = r.hincrby(f"ledger:{job.queue}:active", job.lane, 1)
    started_ms = r.hget(f"emq:{{{job.queue}}}:job:{job.id}", "started_ms")
    r.rpush(key, f"start {job.lane} {p.get('seq', 0)} {job.id} {time.time():.6f} {active} "
                 f"{(started_ms or b'0').decode()}")
    try:
        if p.get("sleep"):
            time.sleep(float(p["sleep"]))  # simulated work inside the job
        if p.get("fail_first") and job.attempts == 1:
            raise RuntimeError("first attempt fails")
    finally:
        r.hincrby(f"ledger:{job.queue}:active", job.lane, -1)
        r.rpush(key, f"end {job.lane} {p.get('seq', 0)} {job.id} {time.time():.6f}")
    return "ok"
