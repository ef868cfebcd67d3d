"""EchoMQ: a job queue on Valkey/Redis that parks instead of polling.

>>> import echomq
>>> q = echomq.Queue("emails", redis_url="redis://127.0.0.1:6379/0")
>>> job_id = q.add("send", {"to": "a@b.c"})
"""

from __future__ import annotations

from echomq import aio
from echomq.backoff import Backoff
from echomq.bulk import add_many
from echomq.config import QueueSettings
from echomq.consumer import Consumer
from echomq.control import Fail, Retry
from echomq.cron import Cron
from echomq.current import current_job
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
    StaleLease,
)
from echomq.job import STATES, Job
from echomq.lanes import Lanes, Outcome
from echomq.pools import configure
from echomq.queue import Queue
from echomq.task import Task, task

__version__ = "0.1.0"

__all__ = [
    "STATES",
    "Backoff",
    "ConfigError",
    "ConnectionFailed",
    "Consumer",
    "CorruptJob",
    "Cron",
    "EchoMQError",
    "Fail",
    "FloorError",
    "FloorSchemaError",
    "HandlerNotFound",
    "InvalidName",
    "InvalidSchedule",
    "JobFailed",
    "JobNotFound",
    "MissingExtra",
    "Job",
    "Lanes",
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
