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
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
import redis.exceptions
from redis.asyncio.connection import DefaultParser as AsyncDefaultParser
from redis.cluster import RedisCluster
from redis.connection import DefaultParser
from redis.crc import key_slot

from echomq import forksafe
from echomq.errors import ConnectionFailed, PermissionDenied

DEFAULT_URL = "redis://127.0.0.1:6379/0"
# what an unreachable, stalled or restarting server raises: retry later, never crash.
# An ACL refusal (NOPERM) is retried the same way: a rule fixed on the server heals a
# running supervisor, where a crash would only restart it into the same refusal.
NETWORK_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError,
                  redis.exceptions.NoPermissionError)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# one host of an authority (a name, an IPv4 or a bracketed IPv6; empty in a unix socket's
# URL) with its port; a Sentinel URL lists several, comma-separated
_HOST = r"(?:\[[0-9A-Za-z:.%]*\]|[A-Za-z0-9._%\-]*)(?::[0-9]*)?"
_HOSTS = re.compile(rf"{_HOST}(?:,{_HOST})*")
# query parameters that carry a secret: password (redis-py, libpq), sentinel_password,
# ssl_password (redis-py: the key file's), sslpassword (libpq), and their like
_SECRET_KEY = re.compile(r"(?i)pass|pwd|secret|token")
_SECRET_PARAM = re.compile(r"(?i)[?&;][^?&;=#/]*(?:pass|pwd|secret|token)[^?&;=#/]*=")


class ServerRefused(redis.exceptions.ResponseError):
    """The server answered but will not run writes for now: out of memory under
    ``noeviction``, a read-only replica after a failover, too few replicas, a failing
    snapshot, a long script, a cluster with a slot left without a master or a slot half
    moved. Nothing was done; the same call can succeed later."""

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


class ClusterDown(ServerRefused, redis.exceptions.ClusterDownError):
    """A cluster node serves no key now: a slot has no master (a master and its replicas
    are gone, or an election is under way) or the node lost the majority."""

    code = "CLUSTERDOWN"


class SlotMoving(ServerRefused, redis.exceptions.TryAgainError):
    """A multi-key call met a slot half moved to another node; it can be sent again."""

    code = "TRYAGAIN"


REFUSALS: dict[str, type[ServerRefused]] = {
    cls.code: cls for cls in (OutOfMemory, ReadOnlyReplica, NoReplicas, PersistenceFailing,
                              ServerBusy, PrimaryDown, ClusterDown, SlotMoving)}
# redis-py's own classes for the same answers, as raised by clients it parses for
_REDIS_PY_REFUSALS: tuple[tuple[type[BaseException], str], ...] = (
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
)
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
    """The server's error code when ``exc`` is a refusal (``OOM``, ``READONLY``,
    ``CLUSTERDOWN``, ``LOADING``...), else None."""
    if isinstance(exc, ServerRefused):
        return exc.code
    for cls, code in _REDIS_PY_REFUSALS:
        if isinstance(exc, cls):
            return code
    return None


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors).

    Parsed, for passwords as generators make them: the userinfo (``user:PASSWORD@``) is
    found from the right (:func:`_userinfo_end`), so an unencoded ``#``, ``/``, ``?``,
    ``@`` or ``:`` in the password is hidden with it; every query parameter carrying a
    secret (``password``, ``sentinel_password``, ``ssl_password``, ``sslpassword``...) is
    hidden up to the next ``&``. Scheme, user, hosts, ports, database and the other
    parameters stay. Never raises, whatever the text.
    """
    text = str(url)
    scheme = _SCHEME.match(text)
    start = scheme.end() if scheme else 0
    at = _userinfo_end(text, start)
    if at == -1:
        return text[:start] + _redact_query(text[start:])
    user, sep, _password = text[start:at].partition(":")
    return f"{text[:start]}{user}{':***' if sep else ''}@{_redact_query(text[at + 1:])}"


def _userinfo_end(text: str, start: int) -> int:
    """The index of the ``@`` ending the userinfo of ``text`` (authority from ``start``),
    or -1 when there is none.

    The last ``@`` a host list follows (then the path, the query or the end), looked for
    before any secret query parameter (whose value may hold an ``@`` too); failing that,
    the last ``@`` there is: better to hide a host than to show a password.
    """
    secret = _SECRET_PARAM.search(text, start)
    end = secret.start() if secret else len(text)
    last = at = text.rfind("@", start, end)
    while at != -1:
        hosts = _HOSTS.match(text, at + 1, end)
        if hosts is not None and (hosts.end() == end or text[hosts.end()] in "/?#"):
            return at
        at = text.rfind("@", start, at)
    return last


def _redact_query(rest: str) -> str:
    """``rest`` (a URL after its userinfo) with the values of secret query parameters
    hidden. A value runs to the next ``&`` or ``;`` (a ``#`` in it is part of it), and
    the pieces without ``=`` right after it are taken for parts of it (an unencoded
    ``&`` in the password)."""
    path, mark, query = rest.partition("?")
    if not mark:
        return rest
    out = []
    hiding = False
    for part in re.split(r"([&;])", query):
        key, eq, _value = part.partition("=")
        if part in ("&", ";"):
            out.append(part)
        elif eq and _SECRET_KEY.search(key):
            out.append(f"{key}=***")
            hiding = True
        elif hiding and not eq and part:
            out.append("***")
        else:
            out.append(part)
            hiding = False
    return f"{path}?{''.join(out)}"


def unencoded_password(url: str) -> bool:
    """Whether ``url`` is read differently by its standard parse than by
    :func:`redact_url`: its userinfo holds an unencoded ``#``, ``/``, ``?`` or ``@`` (or an
    ``@`` follows its host), so a client would take part of the password for the host,
    port or path, connect there and name it in its errors."""
    text = str(url)
    scheme = _SCHEME.match(text)
    if scheme is None:
        return False
    at = _userinfo_end(text, scheme.end())
    if at == -1:
        return False
    try:
        netloc = urlsplit(text).netloc
    except ValueError:
        return False  # the client refuses it too, with a message that quotes no password
    return at >= scheme.end() + len(netloc)


def check_password_encoded(url: str) -> None:
    """Raise ConnectionFailed, before any connection, for a URL whose password holds a
    character that must be percent-encoded (see :func:`unencoded_password`)."""
    if unencoded_password(url):
        raise ConnectionFailed(
            f"invalid Redis URL {redact_url(url)}: its password holds '#', '/', '?' or '@' "
            "(or an '@' follows the host): percent-encode them (%23 %2F %3F %40), "
            "e.g. urllib.parse.quote(password, safe='')")


def describe(client: Client) -> str:
    """A redacted description of where a client connects, for error messages."""
    if isinstance(client, RedisCluster):
        nodes = sorted(n.name for n in client.get_primaries())
        return f"cluster {', '.join(nodes)}"
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
    check_password_encoded(url)
    try:
        if url.partition("://")[0].lower() in SENTINEL_SCHEMES:
            return _sentinel_client(url, options)
        _tls_options(url, options)
        if cluster_mode(url, options):
            try:
                return _cluster_client(url, options)  # type: ignore[return-value]
            except ConnectionFailed:
                # the mode seen earlier may be stale (a plain server now listens where a
                # cluster node did): ask once more before failing
                if _cluster_urls.pop(url, None) is None or cluster_mode(url, options):
                    raise
        return forksafe.tracked(redis.Redis.from_url(url, **options))
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
    return forksafe.tracked(client)


# --- Valkey/Redis Cluster ------------------------------------------------------------
#
# ``connect(url)`` (``client_from_url``) returns a ``redis.cluster.RedisCluster`` when the
# URL names a cluster node: detected from HELLO's ``mode`` once per URL and process, forced
# with ``ECHOMQ_CLUSTER=1``, forbidden with ``ECHOMQ_CLUSTER=0``. Every key of a queue
# shares the ``{queue}`` hash tag, so each call the library makes touches one slot and a
# cluster client routes it to the node that owns it. Blocking calls (a queue's BLPOP, a
# result waiter) get a connection of their own from :func:`blocking_connection`, to the
# node that owns the queue's slot.

CLUSTER_ENV = "ECHOMQ_CLUSTER"
# a cluster's own retry-later errors: no master for a slot during a failover
# (CLUSTERDOWN), a slot being moved (TRYAGAIN past the client's retries), no topology yet
CLUSTER_ERRORS = (redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
                  redis.exceptions.RedisClusterException)
NETWORK_ERRORS = (*NETWORK_ERRORS, *CLUSTER_ERRORS)  # type: ignore[assignment]
UNAVAILABLE_ERRORS = (*UNAVAILABLE_ERRORS, *CLUSTER_ERRORS)  # type: ignore[assignment]
Client = redis.Redis | RedisCluster
T = TypeVar("T")
_cluster_urls: dict[str, bool] = {}  # detection result per URL, once per process
REPLICAS_RECHECK_S = 5.0
_replicas_seen: dict[tuple[Any, Any, Any], tuple[float, int]] = {}  # node -> (until, count)


def connect(url: str | None = None, **options: Any) -> Client:
    """The client for ``url`` (default ``DEFAULT_URL``): a ``RedisCluster`` when it names a
    cluster node, else a ``redis.Redis``. Options go to the connection pool(s)."""
    return client_from_url(url or DEFAULT_URL, **options)


class RefusalPool(redis.ConnectionPool):
    """A node's pool in a cluster client, its connections parsing with RefusalParser
    (redis-py's cluster client passes no parser class on to its nodes)."""

    def __init__(self, connection_class: type[Any] = redis.connection.Connection,
                 max_connections: int | None = None, **connection_kwargs: Any) -> None:
        connection_kwargs.setdefault("parser_class", RefusalParser)
        super().__init__(connection_class, max_connections, **connection_kwargs)
        forksafe.track(self)


def _cluster_client(url: str, options: dict[str, Any]) -> RedisCluster:
    # a copy: a plain client made after (the cluster gone) must not get the nodes' pool
    options = {"connection_pool_class": RefusalPool, **options}
    try:
        return RedisCluster.from_url(_cluster_url(url), **options)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise ConnectionFailed(f"cannot reach the cluster at {redact_url(url)}: {exc}") from exc


def cluster_mode(url: str, options: dict[str, Any] | None = None) -> bool:
    """Whether ``url`` names a cluster node: ``ECHOMQ_CLUSTER`` if set, else HELLO's ``mode``
    (asked with the client's ``options``: timeouts, TLS files).

    A server that cannot be reached now is taken for a single server (and asked again
    next time); a cluster answer is asked again when a cluster client cannot be made.
    Set ``ECHOMQ_CLUSTER=1`` where a cluster must be assumed from the start.
    """
    forced = os.environ.get(CLUSTER_ENV, "").strip()
    if forced in ("1", "0"):
        return forced == "1"
    if url.partition("://")[0].lower() not in ("redis", "rediss"):
        return False  # a unix socket or a Sentinel URL names no cluster node
    if url in _cluster_urls:
        return _cluster_urls[url]
    probe_options = {k: v for k, v in (options or {}).items()
                     if k.startswith(("socket_", "ssl_", "username", "password"))}
    probe = redis.Redis.from_url(url, **probe_options)
    try:
        # HELLO, not INFO: every ACL user may send it (docs/security.md's rules hold)
        reply: Any = probe.execute_command("HELLO")
    except redis.exceptions.RedisError:
        return False
    finally:
        probe.close()
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    mode = reply.get(b"mode", reply.get("mode", b""))
    enabled = (mode.decode() if isinstance(mode, bytes) else str(mode)) == "cluster"
    _cluster_urls[url] = enabled
    return enabled


def _cluster_url(url: str) -> str:
    """A cluster has only database 0: drop a ``/0`` path the single-server URL may carry."""
    parts = urlsplit(url)
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a cluster has only database 0")
    return urlunsplit((parts.scheme, parts.netloc, "", parts.query, parts.fragment))


def is_cluster(client: object) -> bool:
    """True when ``client`` talks to a Valkey/Redis Cluster."""
    return isinstance(client, RedisCluster)


def node_client(client: Client, key: str) -> redis.Redis:
    """The single-node client that serves ``key``: the client itself on one server.

    It does not follow redirects nor re-read the slot map on its own: call it through
    :func:`on_node`, or :func:`refresh` after a failure.
    """
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(client.get_node_from_key(key))
    return client


def on_node(client: Client, key: str, call: Callable[[redis.Redis], T]) -> T:
    """``call`` the node serving ``key``; when that node cannot be reached (a failover),
    re-read the slot map before raising, so the caller's next try finds the new master."""
    try:
        return call(node_client(client, key))
    except NETWORK_ERRORS:
        if isinstance(client, RedisCluster):
            with contextlib.suppress(*NETWORK_ERRORS):
                refresh(client)
        raise


def blocking_connection(client: Client, key: str, socket_timeout: float,
                        address: tuple[str, int] | None = None) -> Any:
    """A new connection of its own for a blocking call on ``key`` (not from any pool),
    to the node owning ``key``'s slot, or to ``address`` (where a redirect pointed)."""
    pool = node_client(client, key).connection_pool
    kwargs: dict[str, Any] = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = socket_timeout
    if address is not None:
        kwargs["host"], kwargs["port"] = address
    return pool.connection_class(**kwargs)


def refresh(client: Client) -> None:
    """Re-read the cluster's slot map (after a failover or a slot move); no-op on one server."""
    if isinstance(client, RedisCluster):
        client.nodes_manager.initialize()


def learn_redirect(client: Client, exc: redis.exceptions.ResponseError) -> None:
    """Teach a cluster client a MOVED its own calls did not see (a blocking call's reply)."""
    if isinstance(client, RedisCluster) and isinstance(exc, redis.exceptions.MovedError):
        client.nodes_manager.move_slot(exc)


def pools(client: Client) -> list[Any]:
    """Every connection pool the client holds (one, or one per cluster node)."""
    if isinstance(client, RedisCluster):
        return [n.redis_connection.connection_pool for n in client.get_nodes()
                if n.redis_connection is not None]
    return [client.connection_pool]


def wait_replicas(client: Client, key: str, replicas: int, timeout_ms: int) -> int | None:
    """See :func:`_wait_replicas`; a lost node makes the slot map be read again."""
    return on_node(client, key, lambda _: _wait_replicas(client, key, replicas, timeout_ms))


def _wait_replicas(client: Client, key: str, replicas: int, timeout_ms: int) -> int | None:
    """How many replicas of the node owning ``key`` hold every write made there so far,
    waiting up to ``timeout_ms`` for ``replicas`` of them (``WAIT``). None when that
    node has no replica (WAIT would block its whole timeout for nothing); that is looked
    up at most every few seconds per node.

    WAIT covers the writes of its own connection, and a pooled connection may not be the
    one that wrote: so one ``INCR`` of ``key`` (a counter in the same slot) is sent on
    the same connection first. Replication is one ordered stream, so replicas that hold
    the INCR hold everything the node applied before it.
    """
    node = node_client(client, key)
    for _ in range(3):  # the owning node, then where a MOVED or an ASK points
        kwargs = node.connection_pool.connection_kwargs
        where = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"))
        now = time.monotonic()
        known = _replicas_seen.get(where)
        if known is None or known[0] < now:
            count = int(node.info("replication").get("connected_slaves", 0))
            known = _replicas_seen[where] = (now + REPLICAS_RECHECK_S, count)
        if known[1] == 0:
            return None
        pipe = node.pipeline(transaction=False)
        asking = node is not node_client(client, key)
        if asking:
            pipe.execute_command("ASKING")
        pipe.incr(key)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        *_, marked, acked = pipe.execute(raise_on_error=False)
        if not isinstance(marked, Exception):
            return int(acked)
        if not (isinstance(marked, redis.exceptions.AskError) and isinstance(client, RedisCluster)):
            raise marked
        learn_redirect(client, marked)  # a MOVED updates the slot map; an ASK does not
        target = client.get_node(host=marked.host, port=int(marked.port))
        if target is None:
            client.nodes_manager.initialize()
            target = client.get_node(host=marked.host, port=int(marked.port))
        node = client.get_redis_connection(target)
    raise redis.exceptions.TryAgainError("the slot kept moving while waiting for replicas")


def connect_async(url: str | None = None, **options: Any) -> Any:
    """The asyncio client for ``url``: ``redis.asyncio.RedisCluster`` for a cluster node,
    else ``redis.asyncio.Redis`` (detection as in :func:`connect`). Refusals (OOM,
    READONLY...) raise the classes of :data:`REFUSALS` on both."""
    import redis.asyncio

    url = url or DEFAULT_URL
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 10.0)
    check_password_encoded(url)
    try:
        _tls_options(url, options)
        if cluster_mode(url, options):
            return async_cluster_from_url(url, **options)
        options.setdefault("parser_class", AsyncRefusalParser)
        return redis.asyncio.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConnectionFailed(f"invalid Redis URL {redact_url(url)}: {exc}") from None


def async_cluster_from_url(url: str, **options: Any) -> Any:
    """A ``redis.asyncio.RedisCluster`` for the cluster ``url``'s node belongs to, its
    connections answering refusals with the classes of :data:`REFUSALS`.

    Options are the cluster client's (timeouts, ``max_connections`` per node, TLS files);
    the URL's ``/0`` path, if any, is dropped (a cluster has only database 0).
    """
    import redis.asyncio.cluster

    options.pop("parser_class", None)  # the cluster client takes none: set below
    try:
        client = redis.asyncio.cluster.RedisCluster.from_url(_cluster_url(url), **options)
    except redis.exceptions.RedisClusterException as exc:
        raise ConnectionFailed(f"cannot use the cluster at {redact_url(url)}: {exc}") from exc
    use_refusal_parser(client)
    return client


def use_refusal_parser(client: Any) -> None:
    """Make an asyncio cluster client's connections (to nodes known now and found later)
    parse with :class:`AsyncRefusalParser`; its constructor takes no parser class."""
    client.connection_kwargs["parser_class"] = AsyncRefusalParser  # shared with its nodes manager
    for node in client.startup_nodes:
        node.connection_kwargs["parser_class"] = AsyncRefusalParser


def is_async_cluster(client: object) -> bool:
    """Whether ``client`` is a ``redis.asyncio.RedisCluster``."""
    import redis.asyncio.cluster

    return isinstance(client, redis.asyncio.cluster.RedisCluster)


async def async_node_of(client: Any, key: str) -> Any:
    """The ``ClusterNode`` owning ``key``'s slot, for an asyncio cluster client (its slot
    map read first if it was not yet)."""
    await client.initialize()  # a no-op once the slot map was read (lazily, on first use)
    return client.get_node_from_key(key)


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
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            *CLUSTER_ERRORS) as exc:
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "certificate verify failed" in str(exc):
            hint = (" (the server's TLS certificate was not accepted: give the CA that signed "
                    "it as ?ssl_ca_certs=PATH in the URL or ECHOMQ_REDIS_TLS_CA_FILE)")
        raise ConnectionFailed(f"cannot reach Valkey/Redis at {where}: {exc}{hint}") from exc


def slot_of(key: str) -> int:
    """The cluster slot of ``key`` (its ``{hash tag}``), as every node computes it."""
    return int(key_slot(key.encode()))
