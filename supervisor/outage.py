"""Whether a queue's server takes the supervisor's calls: ok, unreachable, or refusing writes.

A refusal is an answer, not a network error: out of memory under ``noeviction``,
a read-only replica after a failover, too few replicas (``min-replicas-to-write``),
a failing snapshot (``MISCONF``), a long script (``BUSY``). Either way the queue
waits: nothing is forked, nothing is poked, and a probe runs after a backoff that
never exceeds one beat, so work resumes within a beat of the server taking writes
again. The log says so once per change of state, not once per probe.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from echomq.supervisor.logs import event

from echomq.connection import refusal_code

log = logging.getLogger("echomq.supervisor")
FIRST_RETRY_S = 0.1


@dataclass
class Availability:
    """The server as one queue sees it, with the retry delay and the refusals counted."""

    queue: str
    where: str
    beat_s: float
    state: str = "ok"  # "ok" | "unreachable" | "refused"
    code: str = ""  # the refusal's error code (OOM, READONLY, ...)
    detail: str = ""
    failures: int = 0
    since: float = 0.0
    refusals: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        """True while Valkey answers normally."""
        return self.state == "ok"

    def describe(self) -> str:
        """``ok``, ``unreachable: ...`` or ``refusing writes: OOM ...`` (for /readyz)."""
        if self.state == "ok":
            return "ok"
        if self.state == "refused":
            return f"refusing writes: {self.code} {self.detail}"
        return f"unreachable: {self.detail}"

    def down(self, exc: BaseException | None = None, *, code: str | None = None,
             detail: str = "") -> float:
        """Record a failed call (an exception, or a refusal a consumer reported); returns
        how long to wait before the next probe."""
        if exc is not None:
            code, detail = refusal_code(exc), str(exc)
        state = "refused" if code else "unreachable"
        changed = (state, code or "") != (self.state, self.code)
        if self.state == "ok":
            self.since = time.monotonic()
        self.state, self.code, self.detail = state, code or "", detail[:300]
        self.failures += 1
        if code:
            self.refusals[code] += 1
        delay = min(max(FIRST_RETRY_S, self.beat_s), FIRST_RETRY_S * 2 ** min(self.failures, 6))
        if changed:
            if code:
                event(log, "valkey-refusing", "queue %s: Valkey at %s refuses writes (%s %s); "
                      "waiting for it, probing every %.1fs at most", self.queue, self.where,
                      code, self.detail, max(FIRST_RETRY_S, self.beat_s), level=logging.WARNING,
                      queue=self.queue)
            else:
                event(log, "valkey-unreachable", "queue %s: Valkey unreachable at %s (%s); "
                      "waiting for it, probing every %.1fs at most", self.queue, self.where,
                      self.detail, max(FIRST_RETRY_S, self.beat_s), level=logging.WARNING,
                      queue=self.queue)
        return delay

    def up(self) -> bool:
        """Record a call that succeeded; True when this ends an outage."""
        if self.state == "ok":
            return False
        event(log, "valkey-available", "queue %s: Valkey available again after %.1fs",
              self.queue, time.monotonic() - self.since, queue=self.queue)
        self.state, self.code, self.detail, self.failures = "ok", "", "", 0
        return True
