"""The scheduler's cron part: admits each occurrence of a queue's crons once.

The leader scheduler calls :meth:`CronTable.tick` after each lead call, with the
server's now, the previous leader stamp and the crons' version (all from
``lead.lua``). For every cron it admits the occurrences due since the cron's last
one through ``cron_fire.lua``, which moves the last one in the same call: a retried
call or a new leader admits nothing twice. Which occurrences:

- a scheduler ran moments ago (this leader's previous beat, or a hand-over after a
  leader died: the previous stamp is within ``catchup_ms``): every occurrence due
  since the last one, so a leader change loses none;
- no scheduler ran for longer (every supervisor was down, or Valkey lost its data):
  only the latest occurrence due, once, not once per missed tick.

The next due time is handed back so the scheduler's thread waits for it on its stop
event, the same wait that keeps its beat. The floor keeps a copy of every cron and
its last occurrence (:meth:`sync_floor`); :meth:`restore` puts them back when Valkey
lost its data.
"""

from __future__ import annotations

import logging
from typing import Any

import croniter  # noqa: F401 - see below
import redis

from echomq import cron, scripts
from echomq.cron import CronSpec
from echomq.keys import Keys

# croniter, imported above with the scheduler, in the main thread before any consumer is
# forked or thread started: its import runs `file` in a subprocess (platform.architecture),
# and a consumer forked while that subprocess's exec-status pipe is open keeps the pipe's
# write end, so a scheduler thread importing it at its first cron hung until that consumer
# exited (its leader lease lapsed, no cron fired, no outbox row was relayed)
log = logging.getLogger("echomq.scheduler")
MIRROR_TRIES = 3  # mirrors of Valkey's crons onto the floor in one beat while they change


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class CronTable:
    """The crons of one queue, as the leader scheduler sees them."""

    def __init__(self, queue: str, client: redis.Redis, floor: Any, catchup_ms: int) -> None:
        self.queue = queue
        self.keys = Keys(queue)
        self.client = client
        self.floor = floor
        self.catchup_ms = catchup_ms
        self.specs: dict[str, tuple[CronSpec, str]] = {}  # key -> (spec, stored text)
        self.lasts: dict[str, int] = {}
        self.version: str | None = None  # the version the specs were read at (None: re-read)
        self.next_due_ms: int | None = None
        self.unsynced: dict[str, int] = {}  # last occurrences the floor has not recorded
        self.mirror = False  # the floor's copy is to be replaced with Valkey's
        self.bad: set[str] = set()  # keys already logged as unreadable
        self.fired = self.restored = 0

    def forget(self) -> None:
        """Leadership lost or (re)gained: read everything again before the next fire."""
        self.version = None
        self.next_due_ms = None

    def tick(self, server_now: int, led_prev: str, version: str) -> None:
        """Admit what is due (a leader only) and compute the next due time."""
        if version != self.version:
            self._load(version)
        handover = led_prev.isdigit() and server_now - int(led_prev) <= self.catchup_ms
        nearest: int | None = None
        for key, (spec, _) in list(self.specs.items()):
            last = self.lasts.get(key, server_now)
            try:
                dues = self._dues(spec, last, server_now, handover)
                nxt = cron.next_after(spec.expr, spec.tz, max(last, server_now))
            except Exception as exc:  # an expression this croniter no longer reads
                self._unreadable(key, f"cannot compute its occurrences: {exc}")
                continue
            if dues and not self._fire(spec, dues):
                continue  # removed or replaced meanwhile: re-read on the next beat
            nearest = nxt if nearest is None else min(nearest, nxt)
        self.next_due_ms = nearest

    def restore(self) -> int:
        """Put back the floor's crons Valkey lacks (after a data loss); returns how many."""
        rows = self.floor.cron_rows(self.queue)
        restored = 0
        for start in range(0, len(rows), 200):
            args: list[Any] = []
            for key, spec, last in rows[start:start + 200]:
                args += [key, spec, last]
            restored += int(scripts.CRON_RESTORE(self.client, cron.restore_keys(self.keys),
                                                 args))
        self.restored += restored
        self.forget()
        if restored:
            log.info("queue %s: restored %d cron(s) from the floor", self.queue, restored)
        return restored

    def sync_floor(self, fence: int) -> None:
        """Bring the floor's copy up to date (Valkey holds its data: the epoch is ours)."""
        if self.mirror:
            for _ in range(MIRROR_TRIES):
                rows = [(key, text, self.lasts.get(key, 0))
                        for key, (_, text) in self.specs.items()]
                if rows or self.floor.cron_rows(self.queue):  # a queue without crons: no write
                    self.floor.put_crons(self.queue, rows, fence, only=True)
                # a producer changed the crons since they were read (its own floor write
                # may have come before this one, which undid it): mirror them again
                raw = self.client.hget(self.keys.meta, "crons")
                version = _text(raw) if raw is not None else ""
                if version == self.version:
                    self.mirror = False
                    break
                self._load(version)
            else:
                self.version = None  # still changing: again on the next beat
            self.unsynced.clear()
        elif self.unsynced:
            lasts, self.unsynced = self.unsynced, {}
            try:
                self.floor.crons_fired(self.queue, lasts, fence)
            except Exception:
                for key, last in lasts.items():  # kept for the next try
                    self.unsynced[key] = max(last, self.unsynced.get(key, 0))
                raise

    def _dues(self, spec: CronSpec, last: int, now: int, handover: bool) -> list[int]:
        if handover:
            dues = list(cron.due_between(spec.expr, spec.tz, last, now))
            if len(dues) < cron.MAX_FIRES:
                return dues
        latest = cron.latest_at(spec.expr, spec.tz, now)
        return [latest] if latest > last else []

    def _fire(self, spec: CronSpec, dues: list[int]) -> bool:
        admitted, last = scripts.CRON_FIRE(self.client, cron.fire_keys(self.keys),
                                           [self.keys.prefix, spec.key, spec.rev, *dues])
        if int(admitted) < 0:
            self.version = None
            return False
        self.fired += int(admitted)
        self.lasts[spec.key] = int(last)
        self.unsynced[spec.key] = int(last)
        return True

    def _load(self, version: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.crons)
        pipe.hgetall(self.keys.cronlast)
        specs, lasts = pipe.execute()
        self.specs = {}
        for raw_key, raw in specs.items():
            key, text = _text(raw_key), _text(raw)
            try:
                self.specs[key] = (CronSpec.decode(key, text), text)
            except (ValueError, KeyError, TypeError) as exc:
                self._unreadable(key, f"its spec is malformed: {exc}")
        self.lasts = {_text(k): int(v) for k, v in lasts.items() if _text(v).isdigit()}
        self.version = version
        self.mirror = self.floor is not None

    def _unreadable(self, key: str, why: str) -> None:
        self.specs.pop(key, None)
        if key not in self.bad:
            self.bad.add(key)
            log.error("queue %s: cron %s skipped: %s", self.queue, key, why)
