"""Redis connections: build clients from URLs, redact passwords, translate errors.

Besides redis-py's URLs (``redis://``, ``rediss://``, ``unix://``), a Sentinel-managed
primary is named by ``redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]``:
the hosts are Sentinels (port 26379 by default), SERVICE the name they monitor, and
USER:PASSWORD the primary's ACL user. Clients follow a failover on their own.

TLS: a ``rediss://`` URL verifies the server's certificate against the system's CAs,
or the CA file in its query (``?ssl_ca_certs=PATH``); a client certificate comes from
``ssl_certfile`` / ``ssl_keyfile`` in the query. The same three can be set for every
client of a process by ``ECHOMQ_REDIS_TLS_CA_FILE``, ``ECHOMQ_REDIS_TLS_CERT_FILE``
and ``ECHOMQ_REDIS_TLS_KEY_FILE`` (the URL's query wins).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.exceptions
from redis.asyncio.connection import DefaultParser as AsyncDefaultParser
from redis.connection import DefaultParser

from echomq.errors import ConnectionFailed, PermissionDenied

DEFAULT_URL = "redis://127.0.0.1:6379/0"
# what an unreachable, stalled or restarting server raises: retry later, never crash.
# An ACL refusal (NOPERM) is retried the same way: a rule fixed on the server heals a
# running supervisor, where a crash would only restart it into the same refusal.
NETWORK_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError,
                  redis.exceptions.NoPermissionError)

_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#]*)@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&;](?:password|pass|pwd)=)[^&;#]*")


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


class AsyncRefusalParser(AsyncDefaultParser):  # type: ignore[misc,valid-type]
    """The same for redis.asyncio connections (the consumer's event loop)."""

    EXCEPTION_CLASSES = {**AsyncDefaultParser.EXCEPTION_CLASSES, **REFUSALS}


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


SENTINEL_SCHEMES = ("redis+sentinel", "valkey+sentinel")
SENTINEL_PORT = 26379
#: environment variable -> redis-py option, for every rediss:// client of the process
TLS_ENV = {
    "ECHOMQ_REDIS_TLS_CA_FILE": "ssl_ca_certs",
    "ECHOMQ_REDIS_TLS_CERT_FILE": "ssl_certfile",
    "ECHOMQ_REDIS_TLS_KEY_FILE": "ssl_keyfile",
}


def _tls_options(url: str, options: dict[str, Any]) -> None:
    """Add the ECHOMQ_REDIS_TLS_* files to a rediss:// client's options, unless the URL's
    query or the caller already names them."""
    if url.partition("://")[0].lower() != "rediss":
        return
    query = urlsplit(url).query
    for variable, option in TLS_ENV.items():
        value = os.environ.get(variable)
        if value and option not in options and f"{option}=" not in query:
            options[option] = value


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A redis-py client for ``url``; options go to the connection pool."""
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 10.0)
    options.setdefault("health_check_interval", 0)
    options.setdefault("parser_class", RefusalParser)
    try:
        if url.partition("://")[0].lower() in SENTINEL_SCHEMES:
            return _sentinel_client(url, options)
        _tls_options(url, options)
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConnectionFailed(f"invalid Redis URL {redact_url(url)}: {exc}") from None


def _sentinel_client(url: str, options: dict[str, Any]) -> redis.Redis:
    """A client of the primary that the Sentinels in ``url`` name (see the module doc)."""
    from redis import sentinel as redis_sentinel

    sentinel_class: Any = redis_sentinel.Sentinel  # redis-py leaves it untyped
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host or (colon and not port.isdigit()):
            raise ValueError(f"bad Sentinel address {item!r}")
        sentinels.append((host, int(port) if port else SENTINEL_PORT))
    path = [segment for segment in parts.path.split("/") if segment]
    if not 1 <= len(path) <= 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("expected /SERVICE or /SERVICE/DB after the Sentinel hosts")
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = sentinel_class(sentinels, sentinel_kwargs=timeouts)
    client: redis.Redis = sentinel.master_for(
        path[0], db=int(path[1]) if len(path) == 2 else 0, username=unquote(user) or None,
        password=unquote(password) or None, **options)
    return client


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Turn redis-py connection and timeout errors into ConnectionFailed, and ACL refusals
    into PermissionDenied, each naming ``where`` (redacted)."""
    try:
        yield
    except redis.exceptions.ResponseError as exc:
        # NOPERM for a command; "ACL failure in script: ..." for one a script ran
        if not isinstance(exc, redis.exceptions.NoPermissionError) and \
                "no permissions to run" not in str(exc):
            raise
        raise PermissionDenied(
            f"Valkey/Redis at {where} refused a command (NOPERM): {exc}. The ACL user needs "
            "the rule of its role (producer, supervisor, operator) in docs/security.md") from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "certificate verify failed" in str(exc):
            hint = (" (the server's TLS certificate was not accepted: give the CA that signed "
                    "it as ?ssl_ca_certs=PATH in the URL or ECHOMQ_REDIS_TLS_CA_FILE)")
        raise ConnectionFailed(f"cannot reach Valkey/Redis at {where}: {exc}{hint}") from exc
