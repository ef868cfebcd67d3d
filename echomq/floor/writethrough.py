"""Write scheduled jobs onto the floor at once: the ``sync`` durability dial."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis

from echomq.floor.store import Floor, FloorRow
from echomq.keys import Keys


def write_through(client: redis.Redis, keys: Keys, floor: Floor, job_ids: Sequence[str]) -> int:
    """Copy the hashes of these jobs, where still scheduled, to the floor; returns rows written.

    Unfenced (producers and consumers are not the scheduler), so it never touches a
    spilled row: the scheduler may spill the job between this read and this write,
    and an upsert of the hash read before would mark it "in Valkey" while it is not.
    """
    if not job_ids:
        return 0
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(keys.job(job_id))
    rows = scheduled_rows(job_ids, pipe.execute())
    floor.write_through(keys.queue, rows)
    return len(rows)


def scheduled_rows(job_ids: Sequence[str], hashes: Sequence[Mapping[Any, Any]]
                   ) -> list[FloorRow]:
    """Floor rows of the jobs whose hash (read by the caller, in ``job_ids``' order) is
    still scheduled with a well-formed due time; a malformed one is the scheduler's, and a
    spilled job's stub is not the job (its row is)."""
    rows = []
    for job_id, raw in zip(job_ids, hashes, strict=True):
        h: dict[str, Any] = {_text(k): _text(v) for k, v in raw.items()}
        due = h.get("due_ms") or ""
        if h.get("state") == "scheduled" and due.isdigit() and not h.get("spilled"):
            rows.append(FloorRow(job_id=job_id, due_ms=int(due), fields=h))
    return rows


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
