"""Redis connections: build clients from URLs, redact passwords, translate errors."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import redis
import redis.exceptions

from echomq.errors import ConnectionFailed

DEFAULT_URL = "redis://127.0.0.1:6379/0"
# what an unreachable, stalled or restarting server raises: retry later, never crash
NETWORK_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)

_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#]*)@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&;](?:password|pass|pwd)=)[^&;#]*")


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors).

    Both places a password can be given are hidden: the userinfo (``:pw@``) and the
    query (``?password=``, which redis-py and libpq honour). Works on text, so a URL
    that does not parse (a bad port, say) is redacted too and never raises.
    """
    text = str(url)

    def _userinfo(m: re.Match[str]) -> str:
        user, sep, _password = m["userinfo"].partition(":")
        return f"{m['scheme']}{user}{':***' if sep else ''}@"

    text = _USERINFO.sub(_userinfo, text, count=1)
    return _QUERY_PASSWORD.sub(r"\1***", text)


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
