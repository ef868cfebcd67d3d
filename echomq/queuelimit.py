"""Queue-wide flow limits: ``Queue.set_queue_limit(max_active=, rate=, per_s=)``.

Kept in the lane limits hash under the field ``@queue`` (no lane can be named so), so the
floor copies and restores it like the lanes' (limits_read.lua, limits_restore.lua).
claim.lua applies it across every lane and process, beside the lanes' own limits: active
jobs are counted by the leases, starts in a window of their own.
"""

from __future__ import annotations

from typing import Any

import redis

from echomq import scripts
from echomq.keys import Keys
from echomq.wake import ring

FIELD = "@queue"


def set_queue_limit(client: redis.Redis, k: Keys, value: str) -> None:
    """Record (or clear, with "") the queue-wide limit, then ring: parked consumers claim
    again under the new limit."""
    scripts.set_limit(client, k, FIELD, value)
    kind = client.hget(k.meta, "doorbell")
    ring(client, k, (kind.decode() if isinstance(kind, bytes) else kind) or "list")


def parse(text: bytes | str | None) -> dict[str, Any]:
    """A stored limit as ``{"max_active", "rate", "per_s"}``, None for a part not set."""
    if not text:
        return {"max_active": None, "rate": None, "per_s": None}
    raw = text.decode() if isinstance(text, bytes) else text
    parts = [None if p == "-" else int(p) for p in raw.split()] + [None] * 3
    return {"max_active": parts[0], "rate": parts[1],
            "per_s": parts[2] / 1000 if parts[2] is not None else None}


def read(client: redis.Redis, k: Keys) -> dict[str, Any]:
    """The queue-wide limit (every part None when none is set)."""
    return parse(client.hget(k.limits, FIELD))
