"""The keyspace of one queue: every key starts with ``emq:{<queue>}:``.

The braces are a hash tag, so all keys of a queue live in one Valkey Cluster
slot and every script touches one slot. Names are validated here, once.
"""

from __future__ import annotations

import re

from echomq.errors import InvalidName

NAME_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,255}")
DEFAULT_LANE = "default"
# every queue's name, added by producers and supervisors: `echomq queues` reads it instead of
# KEYS or a SCAN of the whole keyspace (scripts cannot keep it: it lives in another slot)
REGISTRY = "emq:queues"


def validate_name(name: object, what: str = "queue name") -> str:
    """Return ``name`` if it is a valid queue or lane name, else raise InvalidName."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidName(
            f"invalid {what} {name!r}: use 1-128 characters from [A-Za-z0-9._:-]"
            " (braces, spaces and other characters are not allowed)"
        )
    return name


def validate_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is a valid caller-given job id, else raise InvalidName."""
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
        raise InvalidName(
            f"invalid job id {job_id!r}: use 1-255 characters from [A-Za-z0-9._:-]"
        )
    return job_id


class Keys:
    """Key names of one queue. Fixed keys are attributes; per-job and per-lane keys are methods."""

    __slots__ = (
        "queue", "prefix", "ring", "leases", "schedule", "wake", "dead", "completed",
        "stats", "meta", "fold", "closed", "tokens", "epoch", "leader", "fence", "acks", "spilled",
        "marker", "paused", "cancelled", "crons", "cronlast", "limits", "active", "blocked",
        "lanewake", "prios", "waitdeps", "events",
    )

    def __init__(self, queue: str) -> None:
        self.queue = validate_name(queue)
        self.prefix = f"emq:{{{queue}}}:"
        p = self.prefix
        self.ring = p + "ring"
        self.leases = p + "leases"
        self.schedule = p + "schedule"
        self.wake = p + "wake"
        self.dead = p + "dead"
        self.completed = p + "completed"
        self.stats = p + "stats"
        self.meta = p + "meta"
        self.fold = p + "fold"
        self.closed = p + "closed"
        self.tokens = p + "tokens"
        self.epoch = p + "epoch"
        self.leader = p + "leader"
        self.fence = p + "fence"
        self.acks = p + "acks"  # durability "sync": the write a WAIT for replicas rides on
        self.spilled = p + "spilled"  # ids of jobs held by the floor alone
        self.marker = p + "marker"
        self.paused = p + "paused"
        self.cancelled = p + "cancelled"
        self.crons = p + "crons"  # cron key -> spec (JSON)
        self.cronlast = p + "cronlast"  # cron key -> due ms of its last admitted occurrence
        # flow control (docs/flow-control.md): absent until a queue uses it
        self.limits = p + "limits"  # lane -> "max_active rate per_ms" ('-' unset); '*' default
        # lane -> active jobs counted against its max_active (+10**9 while blocked at it)
        self.active = p + "active"
        self.blocked = p + "blocked"  # "<priority>|<lane>": lanes taken off a ring at a limit
        self.lanewake = p + "lanewake"  # rate-limited lanes by the time their window opens
        self.prios = p + "prios"  # priority levels above 0 in use
        self.waitdeps = p + "waitdeps"  # blocked jobs (waiting for dependencies) by created ms
        self.events = p + "events"  # capped stream of job events (docs/observability.md)

    def ring_of(self, priority: int = 0) -> str:
        """The ring of one priority level (level 0 is the plain ring)."""
        return self.ring if priority == 0 else f"{self.prefix}ring{priority}"

    def job(self, job_id: str) -> str:
        """The hash key of one job."""
        return f"{self.prefix}job:{job_id}"

    def lane(self, lane: str, priority: int = 0) -> str:
        """A lane's list of waiting ids at one priority level (0: ``lane:<lane>``)."""
        if priority == 0:
            return f"{self.prefix}lane:{lane}"
        return f"{self.prefix}lane{priority}:{lane}"

    def starts(self, lane: str) -> str:
        """A rate-limited lane's recent starts (zset, ms) within its window."""
        return f"{self.prefix}starts:{lane}"

    def claims(self, claimer: str) -> str:
        """A supervised consumer's record of the jobs its latest claims handed out."""
        return f"{self.prefix}claims:{claimer}"

    def retired(self, claimer: str) -> str:
        """The mark of a dead supervised consumer's claimer name: its claims lease nothing."""
        return f"{self.prefix}retired:{claimer}"

    def done(self, job_id: str) -> str:
        """The result doorbell of one job (rung by settle when a waiter marked the job)."""
        return f"{self.prefix}done:{job_id}"

    def dedup(self, job_id: str) -> str:
        """Holds a completed job's id reserved for its dedup_s."""
        return f"{self.prefix}dedup:{job_id}"
