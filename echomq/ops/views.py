"""What the CLI and the dashboard show, built from the public Queue API (no second path to
the keys): queue summaries and JSON-ready job records."""

from __future__ import annotations

from typing import Any

import redis

from echomq.job import Job
from echomq.keys import REGISTRY
from echomq.queue import Queue

JOB_FIELDS = ("id", "name", "state", "lane", "attempts", "max_attempts", "stalls", "payload",
              "result", "error", "created_ms", "due_ms", "started_ms", "finished_ms")


def job_record(job: Job) -> dict[str, Any]:
    """A job as JSON-ready data (no lease token)."""
    rec = {f: getattr(job, f) for f in JOB_FIELDS}
    if job.after or job.dependents:  # dependencies: what it waits for, what waits for it
        rec.update(after=list(job.after), dependents=list(job.dependents))
    return rec


def queue_exists(q: Queue) -> bool:
    """True when the queue was ever used here: registered, or any of its fixed keys exists."""
    k = q.keys
    client: redis.Redis = q.redis
    if client.sismember(REGISTRY, q.name):
        return True
    return bool(client.exists(k.ring, k.schedule, k.leases, k.dead, k.completed, k.stats,
                              k.meta, k.cancelled, k.paused))


def summary(q: Queue, top_lanes: int = 0) -> dict[str, Any]:
    """Counts, totals and the pause flag of one queue; with ``top_lanes``, its busiest lanes
    and the oldest waiting job's age too."""
    out: dict[str, Any] = {"queue": q.name, **q.stats()}
    if top_lanes:
        survey = q.lanes(top=top_lanes)
        out["oldest_waiting_s"] = survey["oldest_waiting_s"]
        out["busiest_lanes"] = [{"lane": lane, "waiting": n} for lane, n in survey["busiest"]]
        out["lanes_scanned"] = survey["scanned"]
        out["queue_limit"] = q.queue_limit()
    return out
