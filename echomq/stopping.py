"""Cancel of an active job: the script that ends it, the channel that says so, and what a
handler sees.

``stop.lua`` records the job ``cancelled`` ("cancelled while running") and empties its
token, so whatever its handler returns later is refused like any stale settle; then it
publishes the job id on the queue's stop channel. Who runs the handler ends it: the
supervisor (an async job's task is cancelled in its process; a sync job's process is
ended and respawned), a standalone consumer (an async task is cancelled), or the job's
next ``job.progress()`` (raises :class:`JobCancelled`).
"""

from __future__ import annotations

from typing import Any

import redis

from echomq.keys import Keys
from echomq.scripts import STOP, Arg

CANCELLED_TEXT = "cancelled while running"
STOPPED, NO_JOB, NOT_ACTIVE = 1, 0, 2


class JobCancelled(Exception):  # noqa: N818 - named for what happened to the job
    """Raised inside a handler (by ``job.progress()``) whose job was cancelled while it ran;
    letting it propagate ends the handler. The job is already recorded ``cancelled``."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} was cancelled while running")


def channel(k: Keys) -> str:
    """The pub/sub channel on which stop.lua publishes the id of each job it cancelled."""
    return k.prefix + "stops"


def stop_keys(k: Keys) -> list[str]:
    """KEYS of stop.lua (shared by the sync and the asyncio producer)."""
    return [k.leases, k.cancelled, k.active, k.blocked, k.ring, k.prios, k.lanewake, k.wake,
            k.meta, k.closed, k.events]


def stop_args(k: Keys, job_id: str) -> list[Arg]:
    """ARGV of stop.lua."""
    return [k.prefix, job_id, channel(k), CANCELLED_TEXT]


def stop(client: redis.Redis, k: Keys, job_id: str) -> int:
    """Cancel an active job; STOPPED, NO_JOB or NOT_ACTIVE (a settle came first)."""
    return int(STOP(client, stop_keys(k), stop_args(k, job_id)))


def decode_id(message: Any) -> str | None:
    """The job id of a pub/sub message on a stop channel, None for other messages."""
    if not isinstance(message, dict) or message.get("type") != "message":
        return None
    data = message.get("data")
    return data.decode() if isinstance(data, bytes) else str(data)
