"""The stream of job events: every state change of a queue's jobs, in order.

The script that changes a job's state appends the event to the queue's stream
``emq:{<queue>}:events`` in the same call, so events are never out of order with the
states they describe. One stream entry holds the events of one script call (one XADD
for a claimed or settled batch, not one per job), field ``e``: a line per event,
``kind job_id lane attempt[ extra]``. An event's id is its entry's id and its index in
the entry (``1700000000000-0-3``). The stream is capped at about 10,000 events by
default (``MAXLEN ~`` the cap divided by the events of the entry written) and on by
default; :meth:`echomq.Queue.set_events` turns it off or resizes it (recorded in the
queue's meta, read by the scripts).

Kinds: ``added`` (admitted; ``due_ms`` when deferred), ``started`` (claimed, with its
``attempt``), ``completed``, ``failed`` (an attempt failed, another comes at
``due_ms``), ``dead`` (no attempt left or ``echomq.Fail``; ``reason`` "stalled" when
its leases expired too often, "buried" when set aside as unrunnable), ``retried`` (a
dead job re-admitted), ``cancelled``, ``progress`` (with the reported value),
``waiting`` (a deferred job came due), ``stalled`` (its lease expired: back to
waiting) and ``requeued`` (handed back unstarted by a stopping consumer).

Jobs with dependencies: ``blocked`` (admitted to wait for its dependencies; one with
nothing left to wait for is ``added``), ``waiting`` with reason ``unblocked`` (its
dependencies ended: it entered its lane) and ``dead`` with reason "dependency <id>
dead" (or "... cancelled"). A running job cancelled is ``cancelled`` with reason
"cancelled while running"; a job past its expiry ``cancelled`` with reason
"expired". A debounced add opens a job (``added`` with its ``due_ms``) or is
``gathered`` into the open one (with the new ``due_ms``). A job put back from the
durable floor after Valkey lost its data is ``waiting`` with reason ``restored``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from echomq.keys import Keys

DEFAULT_MAX_EVENTS = 10_000
MAX_BLOCK_MS = 5_000  # one XREAD waits at most this long (below the clients' socket timeout)
READ_COUNT = 500
KINDS = ("added", "started", "completed", "failed", "dead", "retried", "cancelled", "progress",
         "waiting", "stalled", "requeued", "blocked", "gathered")


@dataclass(frozen=True)
class Event:
    """One state change of one job. ``id``: its place in the stream (pass it as
    ``since`` to read on after it); ``at``: when the server wrote it (UTC);
    ``attempt``: for started, completed, failed and dead; ``data``: the kind's other
    field, if any (``due_ms`` of added and failed, ``reason`` of dead, ``progress``)."""

    id: str
    job_id: str
    kind: str
    at: datetime
    lane: str
    attempt: int | None = None
    data: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready values (``at`` in ISO 8601)."""
        out: dict[str, Any] = {"id": self.id, "job_id": self.job_id, "kind": self.kind,
                               "at": self.at.isoformat(timespec="milliseconds"),
                               "lane": self.lane}
        if self.attempt is not None:
            out["attempt"] = self.attempt
        out.update(self.data)
        return out

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


_EXTRA = {"added": "due_ms", "failed": "due_ms", "gathered": "due_ms", "dead": "reason",
          "cancelled": "reason", "waiting": "reason", "progress": "progress"}


def parse_entry(entry_id: bytes | str, fields: Mapping[Any, Any]) -> list[Event]:
    """The events of one stream entry (the events of one script call), in order."""
    sid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    raw = fields.get(b"e", fields.get("e", b""))
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    at = datetime.fromtimestamp(int(sid.split("-", 1)[0]) / 1000, UTC)
    out = []
    for i, line in enumerate(text.split("\n")):
        parts = line.split(" ", 4)
        if len(parts) < 4:
            continue  # not an event line (written by something else)
        kind, job_id, lane, attempt = parts[:4]
        data = {_EXTRA.get(kind, "extra"): parts[4]} if len(parts) == 5 else {}
        out.append(Event(id=f"{sid}-{i}", job_id=job_id, kind=kind, at=at, lane=lane,
                         attempt=int(attempt) if attempt.isdigit() else None, data=data))
    return out


def _split_since(since: str) -> tuple[str, int]:
    """(stream entry id to read after, events of that entry already seen - 1 or -1 for
    none): "ms-seq-i" is event i of entry ms-seq; a bare entry id means all of it."""
    parts = since.split("-")
    if len(parts) == 3:
        return f"{parts[0]}-{parts[1]}", int(parts[2])
    return since, -1


def check_args(since: str, block_s: float | None) -> None:
    """ValueError for a ``since`` that is no event or stream id, or a negative ``block_s``."""
    parts = since.split("-") if isinstance(since, str) else []
    if since != "$" and not (1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        raise ValueError(f"since must be an event id, a stream id ('0', '1700000000000-0') "
                         f"or '$', got {since!r}")
    if block_s is not None and not block_s >= 0:
        raise ValueError(f"block_s must be >= 0 or None, got {block_s!r}")


def _block_ms(deadline: float | None) -> int | None:
    """The BLOCK of the next XREAD: None for no wait, else at most MAX_BLOCK_MS."""
    if deadline is None:
        return MAX_BLOCK_MS
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    return max(1, min(MAX_BLOCK_MS, int(remaining * 1000)))


def read(client: redis.Redis, keys: Keys, since: str = "0", block_s: float | None = 1.0
         ) -> Iterator[Event]:
    """Events after ``since`` (see :meth:`echomq.Queue.events`)."""
    check_args(since, block_s)
    if since == "$":  # only what comes from now on: start at the newest entry there is
        newest = client.xrevrange(keys.events, count=1)
        since = newest[0][0].decode() if newest else "0"
    last, seen = _split_since(since)
    if seen >= 0:  # the rest of a partly read entry
        for entry_id, fields in client.xrange(keys.events, last, last):
            yield from parse_entry(entry_id, fields)[seen + 1:]
    deadline = None if block_s is None else time.monotonic() + block_s
    while True:
        batch = client.xread({keys.events: last}, count=READ_COUNT)
        if not batch:
            block = _block_ms(deadline)
            if block is None:
                return
            batch = client.xread({keys.events: last}, count=READ_COUNT, block=block)
            if not batch:
                continue
        for entry_id, fields in batch[0][1]:
            last = entry_id.decode()
            yield from parse_entry(entry_id, fields)
        if block_s is not None:
            deadline = time.monotonic() + block_s  # the wait restarts at each event


async def aread(client: Any, keys: Keys, since: str = "0", block_s: float | None = 1.0
                ) -> AsyncIterator[Event]:
    """The asyncio twin of :func:`read`."""
    check_args(since, block_s)
    if since == "$":
        newest = await client.xrevrange(keys.events, count=1)
        since = newest[0][0].decode() if newest else "0"
    last, seen = _split_since(since)
    if seen >= 0:
        for entry_id, fields in await client.xrange(keys.events, last, last):
            for event in parse_entry(entry_id, fields)[seen + 1:]:
                yield event
    deadline = None if block_s is None else time.monotonic() + block_s
    while True:
        batch = await client.xread({keys.events: last}, count=READ_COUNT)
        if not batch:
            block = _block_ms(deadline)
            if block is None:
                return
            batch = await client.xread({keys.events: last}, count=READ_COUNT, block=block)
            if not batch:
                continue
        for entry_id, fields in batch[0][1]:
            last = entry_id.decode()
            for event in parse_entry(entry_id, fields):
                yield event
        if block_s is not None:
            deadline = time.monotonic() + block_s


def set_events(client: Any, keys: Keys, enabled: bool, max_len: int | None) -> list[Any]:
    """The HSET arguments recording the switch (and cap) in the queue's meta."""
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled must be True or False, got {enabled!r}")
    mapping: dict[str, Any] = {"events": "1" if enabled else "0"}
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
        mapping["events_max"] = str(max_len)
    return [keys.meta, mapping]
