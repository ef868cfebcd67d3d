"""Redis connections: build clients from URLs, redact passwords, translate errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.exceptions
from redis.connection import DefaultParser

from echomq.errors import ConnectionFailed

DEFAULT_URL = "redis://127.0.0.1:6379/0"
# what an unreachable, stalled or restarting server raises: retry later, never crash
NETWORK_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class ServerRefused(redis.exceptions.ResponseError):
    """The server answered but will not run writes for now: out of memory under
    ``noeviction``, a read-only replica after a failover, too few replicas, a failing
    snapshot, a long script. Nothing was done; the same call can succeed later."""

    code = ""


class OutOfMemory(ServerRefused, redis.exceptions.OutOfMemoryError):
    code = "OOM"


class ReadOnlyReplica(ServerRefused, redis.exceptions.ReadOnlyError):
    code = "READONLY"


class NoReplicas(ServerRefused):
    code = "NOREPLICAS"


class PersistenceFailing(ServerRefused):
    code = "MISCONF"


class ServerBusy(ServerRefused):
    code = "BUSY"


class PrimaryDown(ServerRefused, redis.exceptions.MasterDownError):
    code = "MASTERDOWN"


REFUSALS: dict[str, type[ServerRefused]] = {
    cls.code: cls for cls in (OutOfMemory, ReadOnlyReplica, NoReplicas, PersistenceFailing,
                              ServerBusy, PrimaryDown)}
# what a server that cannot take our writes now raises, reachable or not: wait, never crash
# (redis-py's own classes too, for clients not built by client_from_url)
UNAVAILABLE_ERRORS = (*NETWORK_ERRORS, ServerRefused, redis.exceptions.OutOfMemoryError,
                      redis.exceptions.ReadOnlyError)


class RefusalParser(DefaultParser):  # type: ignore[misc,valid-type]
    """redis-py's parser, answering the refusals above with their own exception classes."""

    EXCEPTION_CLASSES = {**DefaultParser.EXCEPTION_CLASSES, **REFUSALS}


def refusal_code(exc: BaseException) -> str | None:
    """The server's error code when ``exc`` is a refusal (``OOM``, ``READONLY``...), else None."""
    if isinstance(exc, ServerRefused):
        return exc.code
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return "OOM"
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return "READONLY"
    return None


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{user}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def describe(client: redis.Redis) -> str:
    """A redacted description of where a client connects, for error messages."""
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    password = "***@" if kwargs.get("password") else ""
    host, port, db = kwargs.get("host", "?"), kwargs.get("port", "?"), kwargs.get("db", 0)
    return f"redis://{password}{host}:{port}/{db}"


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A redis-py client for ``url``; options go to the connection pool."""
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 10.0)
    options.setdefault("health_check_interval", 0)
    options.setdefault("parser_class", RefusalParser)
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConnectionFailed(f"invalid Redis URL {redact_url(url)}: {exc}") from None


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Turn redis-py connection and timeout errors into ConnectionFailed naming ``where``."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise ConnectionFailed(f"cannot reach Valkey/Redis at {where}: {exc}") from exc
