"""Cron schedules: validating them, computing their occurrences, and the script calls
that store and fire them (the pure layer shared by the sync and asyncio queues and the
supervisor's scheduler).

Expressions are croniter's: five fields (minute hour day month weekday), an
optional sixth for seconds (``"*/10 * * * * *"`` is every ten seconds), or an alias
such as ``@hourly``. croniter (maintained under pallets-eco) is chosen over cronsim
because it reads that six-field seconds convention and evaluates in any IANA time
zone; it is an optional dependency (``echomq[cron]``, and part of
``echomq[supervisor]``), imported on first use, so a producer that never adds a cron
does not need it.

Each occurrence is admitted as a job with the id ``cron:<key>:<due_ms>``, by one
script that also records it as the cron's last admitted occurrence: exactly once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from echomq.errors import InvalidName, InvalidSchedule
from echomq.extras import require
from echomq.keys import DEFAULT_LANE, Keys, validate_name

MAX_FIRES = 1000  # occurrences admitted for one cron in one pass (a hand-over's catch-up)


@dataclass(frozen=True)
class Cron:
    """One cron of a queue, as :meth:`echomq.Queue.crons` lists it.

    ``payload`` is the decoded payload; ``last_ms`` is the due time of the last
    occurrence admitted (or when the cron was added, before its first one) and
    ``next_ms`` the next due time after both that and this host's now (ms since the
    epoch; None when croniter is not installed where the list was read).
    """

    key: str
    expr: str
    name: str
    payload: Any
    lane: str
    tz: str
    last_ms: int | None = None
    next_ms: int | None = None


@dataclass(frozen=True)
class CronSpec:
    """A stored cron: what the scheduler needs to admit its occurrences."""

    key: str
    expr: str
    name: str
    payload: str  # encoded JSON
    lane: str
    tz: str
    rev: str  # changes whenever the cron is replaced: a fire of an older rev is refused
    max_attempts: int
    max_stalls: int

    def encode(self) -> str:
        """The spec as the JSON Valkey and the floor store (``rev`` tells replacements apart)."""
        return json.dumps({"expr": self.expr, "name": self.name, "payload": self.payload,
                           "lane": self.lane, "tz": self.tz, "rev": self.rev,
                           "max_attempts": self.max_attempts, "max_stalls": self.max_stalls},
                          separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, key: str, text: str | bytes) -> CronSpec:
        """Parse a stored spec; raises ValueError when it is malformed."""
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("a cron spec is a JSON object")
        return cls(key=key, expr=str(d["expr"]), name=str(d["name"]), payload=str(d["payload"]),
                   lane=str(d["lane"]), tz=str(d["tz"]), rev=str(d["rev"]),
                   max_attempts=int(d["max_attempts"]), max_stalls=int(d["max_stalls"]))

    def public(self, last_ms: int | None, next_ms: int | None) -> Cron:
        """The user-facing `Cron` record with its last and next occurrence."""
        return Cron(self.key, self.expr, self.name, json.loads(self.payload), self.lane, self.tz,
                    last_ms, next_ms)


def validate_key(key: object) -> str:
    """A cron key: 1-128 characters from [A-Za-z0-9._:-] (it becomes part of job ids);
    InvalidName otherwise."""
    return validate_name(key, "cron key")


def zone(tz: object) -> Any:
    """The ``ZoneInfo`` of an IANA zone name; InvalidSchedule for an unknown one."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not isinstance(tz, str) or not tz or len(tz) > 64:
        raise InvalidSchedule(f"invalid time zone {tz!r}: give an IANA name such as 'UTC' "
                              "or 'Europe/Paris'")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(f"unknown time zone {tz!r}: give an IANA name such as 'UTC' "
                              "or 'Europe/Paris'") from None


def validate_expr(expr: object, tz: object = "UTC") -> str:
    """Return ``expr`` when croniter reads it as five fields, six (the last one seconds) or
    an ``@`` alias; InvalidSchedule otherwise. MissingExtra without croniter."""
    require("cron", "a cron schedule")
    from croniter import croniter

    if not isinstance(expr, str) or not expr.strip() or len(expr) > 256:
        raise InvalidSchedule(f"invalid cron expression {expr!r}: a string such as "
                              "'*/5 * * * *'")
    fields = expr.split()
    if not expr.startswith("@") and len(fields) not in (5, 6):
        raise InvalidSchedule(f"invalid cron expression {expr!r}: give 5 fields (minute hour "
                              "day month weekday) or 6 (the sixth is seconds)")
    try:
        # one step proves the expression can produce an occurrence (e.g. not "0 0 31 2 *")
        croniter(expr, datetime.now(zone(tz))).get_next(float)
    except InvalidSchedule:
        raise
    except Exception as exc:  # croniter raises ValueError subclasses and, rarely, others
        raise InvalidSchedule(f"invalid cron expression {expr!r}: {exc}") from None
    return expr


def _iter(spec_expr: str, tz: str, start_ms: int) -> Any:
    from croniter import croniter

    start = datetime.fromtimestamp(start_ms / 1000, tz=UTC).astimezone(zone(tz))
    return croniter(spec_expr, start)


def _fixed_hour(expr: str) -> bool:
    """True when the expression names its hours outright (digits and commas): such a job
    runs once at its wall time, also in the hour a fall-back repeats (Vixie cron's rule);
    one with a wildcard, step or range in the hour runs by the clock, twice there."""
    fields = expr.split()
    return len(fields) >= 5 and all(c.isdigit() or c == "," for c in fields[1])


def _repeat(due_ms: int, tz: str) -> bool:
    """True when ``due_ms`` is the second instant of a wall time the zone repeats."""
    return datetime.fromtimestamp(due_ms / 1000, tz=zone(tz)).fold == 1


def _dues(it: Any, step: str, expr: str, tz: str) -> Iterator[int]:
    """Due times (ms) from a croniter, without the repeats of a fixed-hour expression."""
    fixed = _fixed_hour(expr)
    while True:
        due = int(round(getattr(it, step)(float) * 1000))
        if not (fixed and _repeat(due, tz)):
            yield due


def next_after(expr: str, tz: str, after_ms: int) -> int:
    """The first due time (ms) strictly after ``after_ms``."""
    return next(_dues(_iter(expr, tz, after_ms), "get_next", expr, tz))


def latest_at(expr: str, tz: str, now_ms: int) -> int:
    """The last due time (ms) at or before ``now_ms``."""
    return next(_dues(_iter(expr, tz, now_ms + 1), "get_prev", expr, tz))


def due_between(expr: str, tz: str, after_ms: int, until_ms: int,
                limit: int = MAX_FIRES) -> Iterator[int]:
    """Due times in ``(after_ms, until_ms]``, earliest first, at most ``limit``. A
    fixed-hour expression runs once in an hour the zone repeats (the first instant)."""
    dues = _dues(_iter(expr, tz, after_ms), "get_next", expr, tz)
    for _ in range(limit):
        due = next(dues)
        if due > until_ms:
            return
        yield due


def job_id(key: str, due_ms: int) -> str:
    """The id of the job an occurrence admits."""
    return f"cron:{key}:{due_ms}"


def make_spec(key: object, expr: object, name: object, payload_text: str, lane: object,
              tz: object, max_attempts: int, max_stalls: int) -> CronSpec:
    """Validate every part of a cron (nothing is stored on an error)."""
    key = validate_key(key)
    zone(tz)
    validate_expr(expr, tz)
    if not isinstance(name, str) or not name or len(name) > 255:
        raise InvalidName(f"invalid job name {name!r}: a non-empty string of at most 255 chars")
    lane = validate_name(lane, "lane name") if lane is not None else DEFAULT_LANE
    assert isinstance(expr, str) and isinstance(tz, str)
    return CronSpec(key, expr, name, payload_text, lane, tz, uuid.uuid4().hex, max_attempts,
                    max_stalls)


# --- script calls ----------------------------------------------------------------

def set_keys(k: Keys) -> list[str]:
    """KEYS of cron_set.lua, in its header's order."""
    return [k.crons, k.cronlast, k.meta]


def remove_keys(k: Keys) -> list[str]:
    """KEYS of cron_remove.lua, in its header's order."""
    return [k.crons, k.cronlast, k.meta]


def fire_keys(k: Keys) -> list[str]:
    """KEYS of cron_fire.lua, in its header's order."""
    return [k.crons, k.cronlast, k.ring, k.wake, k.spilled, k.stats, k.paused, k.events]


def restore_keys(k: Keys) -> list[str]:
    """KEYS of cron_restore.lua, in its header's order."""
    return [k.crons, k.cronlast, k.meta]


def parse_listing(specs: dict[Any, Any], lasts: dict[Any, Any], with_next: bool = True
                  ) -> list[Cron]:
    """The public view of the crons hash and the last-occurrence hash, sorted by key."""
    out = []
    for raw_key, text in specs.items():
        key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
        try:
            spec = CronSpec.decode(key, text)
        except (ValueError, KeyError, TypeError):
            continue  # not written by add_cron: nothing to show
        raw_last = lasts.get(raw_key, lasts.get(key))
        last = int(raw_last) if raw_last is not None else None
        nxt = None
        if with_next and last is not None:
            try:
                nxt = next_after(spec.expr, spec.tz, max(last, int(time.time() * 1000)))
            except Exception:  # croniter missing here, or an expression it no longer reads
                nxt = None
        out.append(spec.public(last, nxt))
    return sorted(out, key=lambda c: c.key)
