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


LIVE_STATES = ("scheduled", "waiting", "active")
CURRENT_TRIES = 5  # writes of one job's row while other adds keep changing it


def current_row(job_id: str, raw: Mapping[Any, Any]) -> FloorRow | None:
    """The floor row of a job from its hash, in whatever live state it is (a debounced job
    a beat promoted already is waiting or active); None for a finished, spilled or
    malformed one."""
    h: dict[str, Any] = {_text(k): _text(v) for k, v in raw.items()}
    if h.get("state") not in LIVE_STATES or h.get("spilled"):
        return None
    due = (h.get("due_ms") if h["state"] == "scheduled" else h.get("created_ms")) or ""
    return FloorRow(job_id=job_id, due_ms=int(due), fields=h) if due.isdigit() else None


def write_current(client: redis.Redis, keys: Keys, floor: Floor, job_id: str) -> None:
    """Write a job's row from its hash until the hash read after the write is the one
    written: another add that changed the job meanwhile (a debounced job gathering a
    payload) may have written its newer row before this older one overwrote it, so the
    last writer's row is the newest."""
    raw = client.hgetall(keys.job(job_id))
    for _ in range(CURRENT_TRIES):
        row = current_row(job_id, raw)
        if row is None:
            return
        floor.write_through(keys.queue, [row])
        again = client.hgetall(keys.job(job_id))
        if again == raw:
            return
        raw = again


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
