"""What the supervisor keeps for each queue: its settings, handler, beat, slots and the
server's availability, shared by the loop and the roles it delegates to (children,
doorbells, releases, leases). Records only: nothing here acts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from echomq.supervisor.children import Child, Slot
from echomq.supervisor.metronome import Metronome
from echomq.supervisor.outage import Availability
from echomq.supervisor.settings import QueueSpec

from echomq.config import QueueSettings


@dataclass
class QueueRuntime:
    """Everything the arbiter keeps for one queue."""

    spec: QueueSpec
    settings: QueueSettings
    handler: Callable[..., Any]
    metronome: Metronome
    slots: list[Slot]
    availability: Availability
    work_seen: float = 0.0
    bell_holder: Any = None  # the child parked on the doorbell in the metronome's stead
    park_after: float = 0.0  # no child is handed the doorbell before (a park failed)
    claim_jobs: int = 0
    claim_wait_us: int = 0
    restarts: int = 0
    scheduler: Any = None
    children_by_fd: dict[int, Child] = field(default_factory=dict)
    # hand-backs of dead children's jobs the server did not take (it was unreachable):
    # ("claims", claimer name, {(id, token) held}) or ("jobs", [(id, token)], mode);
    # retried before the reap can charge their expired leases a stall, their leases
    # extended meanwhile
    unreleased: list[tuple[str, Any, Any]] = field(default_factory=list)

    @property
    def children(self) -> list[Child]:
        """The queue's live consumer processes."""
        return [s.child for s in self.slots if s.child is not None]

    @property
    def healthy(self) -> bool:
        """True while Valkey takes this queue's writes (no refusal, no outage)."""
        return self.availability.ok
