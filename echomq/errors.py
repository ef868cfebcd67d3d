"""Exceptions raised by EchoMQ. Every one says what was wrong and never leaks a password."""

from __future__ import annotations


class EchoMQError(Exception):
    """Base class of every EchoMQ error."""


class ConfigError(EchoMQError, ValueError):
    """A setting, flag or environment variable has an invalid value."""


class InvalidName(EchoMQError, ValueError):
    """A queue or lane name is empty, too long, or holds characters outside [A-Za-z0-9._:-]."""


class PayloadError(EchoMQError, ValueError):
    """A payload (or progress) is not JSON-serialisable, or exceeds the size or depth limit
    (``QueueSettings.max_payload_bytes``, ``max_payload_depth``); the message names it."""


class InvalidSchedule(EchoMQError, ValueError):
    """A delay is negative or a run_at datetime is naive."""


class ConnectionFailed(EchoMQError, ConnectionError):
    """The Valkey/Redis server cannot be reached. The message carries the redacted URL."""


class NotReplicated(EchoMQError):
    """Durability "sync": no replica confirmed an admit in time (the job may not survive a
    failover of its node; admitting again with the same job id is safe)."""


class PermissionDenied(EchoMQError, PermissionError):
    """The server's ACL refused a command: the message names it and where the role rules are."""


class CorruptJob(EchoMQError):
    """A job hash lacks required fields or holds a payload that is not valid JSON, or that
    nests too deep to decode (written by a producer that skipped the admit checks)."""


class StaleLease(EchoMQError):
    """A settle or extend presented a lease token that no longer holds the job."""


class HandlerNotFound(EchoMQError, ImportError):
    """A ``module:callable`` handler cannot be imported or is not callable."""


class FloorError(EchoMQError):
    """The durable floor (SQL database) failed or is misconfigured."""


class FloorSchemaError(FloorError):
    """The floor's schema is not at the migration head."""


class StaleFence(FloorError):
    """A floor write carried a leader fence older than the one stored: another scheduler leads."""


class MissingExtra(EchoMQError, ImportError):
    """A feature's optional dependencies are not installed; the message names the extra."""


class ProtocolMismatch(EchoMQError):
    """The queue's meta records a wire protocol of another MAJOR version than this
    client's (docs/protocol.md); nothing was sent."""


class JobFailed(EchoMQError):
    """``Queue.result`` found the job dead; ``.error`` holds its last error (the traceback text)."""

    def __init__(self, job_id: str, error: str) -> None:
        super().__init__(f"job {job_id!r} is dead: {_last_line(error)}")
        self.job_id = job_id
        self.error = error


class JobNotFound(EchoMQError, LookupError):
    """No job with this id exists (never admitted, or its record was dropped by retention)."""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no error text)"


class OutboxError(EchoMQError, ValueError):
    """``tx=``: not a SQLAlchemy Connection/Session (sync or async), or its database has no
    outbox table (run ``echomq-supervisor migrate``); nothing was written."""


class UnknownDependency(EchoMQError, LookupError):
    """A job named a dependency (``after=``) that does not exist; nothing was admitted."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"unknown dependency {job_id!r}: no such job in this queue "
                         "(nothing was admitted)")
        self.job_id = job_id
