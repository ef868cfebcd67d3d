"""EchoMQ: a job queue on Valkey/Redis that parks instead of polling.

>>> import echomq
>>> q = echomq.Queue("emails", redis_url="redis://127.0.0.1:6379/0")
>>> job_id = q.add("send", {"to": "a@b.c"})
"""

from __future__ import annotations

from echomq import aio
from echomq.backoff import Backoff
from echomq.bulk import add_many
from echomq.canvas import Signature, Workflow, chain, chord, group, signature
from echomq.config import QueueSettings
from echomq.consumer import Consumer
from echomq.control import Fail, Retry
from echomq.cron import Cron
from echomq.current import current_job
from echomq.debouncing import DebounceClash
from echomq.errors import (
    ConfigError,
    ConnectionFailed,
    CorruptJob,
    EchoMQError,
    FloorError,
    FloorSchemaError,
    HandlerNotFound,
    InvalidName,
    InvalidSchedule,
    JobFailed,
    JobNotFound,
    MissingExtra,
    NotReplicated,
    PayloadError,
    ProtocolMismatch,
    StaleLease,
    UnknownDependency,
)
from echomq.events import Event
from echomq.job import STATES, Job
from echomq.lanes import Lanes, Outcome
from echomq.middleware import Middleware
from echomq.pools import configure
from echomq.queue import Queue
from echomq.stopping import JobCancelled
from echomq.task import Task, task

__version__ = "0.1.0"

__all__ = [
    "STATES",
    "Backoff",
    "Signature",
    "UnknownDependency",
    "Workflow",
    "chain",
    "chord",
    "group",
    "signature",
    "ConfigError",
    "ConnectionFailed",
    "Consumer",
    "CorruptJob",
    "Cron",
    "DebounceClash",
    "EchoMQError",
    "Event",
    "Fail",
    "FloorError",
    "FloorSchemaError",
    "HandlerNotFound",
    "InvalidName",
    "InvalidSchedule",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "MissingExtra",
    "ProtocolMismatch",
    "Job",
    "Lanes",
    "Middleware",
    "NotReplicated",
    "Outcome",
    "PayloadError",
    "Queue",
    "QueueSettings",
    "Retry",
    "StaleLease",
    "Task",
    "add_many",
    "aio",
    "configure",
    "current_job",
    "task",
]
