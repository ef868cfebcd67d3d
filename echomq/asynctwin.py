"""The asyncio twin of a sync client: the same server, options and TLS files, for the
concurrent drain's event loop (a sync client's connections cannot be awaited)."""

from __future__ import annotations

import inspect
from typing import Any

import redis
import redis.asyncio
from redis.cluster import RedisCluster

from echomq.connection import AsyncRefusalParser, Client, use_refusal_parser


def async_twin(client: Client) -> Any:
    """An asyncio client for the server (and options) a sync client talks to: a
    ``redis.asyncio.RedisCluster`` for a cluster client."""
    if isinstance(client, RedisCluster):
        return _async_cluster_twin(client)
    pool: Any = client.connection_pool
    sync_cls = pool.connection_class
    if issubclass(sync_cls, redis.connection.UnixDomainSocketConnection):
        cls: Any = redis.asyncio.UnixDomainSocketConnection
    elif issubclass(sync_cls, redis.connection.SSLConnection):
        cls = redis.asyncio.SSLConnection
    else:
        cls = redis.asyncio.Connection
    accepted: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            accepted |= set(inspect.signature(init).parameters)
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in accepted}
    if "parser_class" in kwargs:  # a sync parser cannot read for an asyncio connection
        kwargs["parser_class"] = AsyncRefusalParser
    return redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool(
        connection_class=cls, **kwargs))


def _async_cluster_twin(client: RedisCluster) -> Any:
    """An asyncio cluster client seeded with every node the sync one knows, with the
    options (credentials, timeouts, TLS files) of its node connections."""
    import redis.asyncio.cluster

    nodes = client.get_nodes()
    kwargs: dict[str, Any] = {}
    if nodes and nodes[0].redis_connection is not None:
        pool = nodes[0].redis_connection.connection_pool
        kwargs = dict(pool.connection_kwargs)
        if issubclass(pool.connection_class, redis.connection.SSLConnection):
            kwargs["ssl"] = True
    accepted = set(inspect.signature(redis.asyncio.cluster.RedisCluster.__init__).parameters)
    kwargs = {k: v for k, v in kwargs.items()
              if k in accepted and k not in ("host", "port", "startup_nodes", "db", "path")}
    seeds = [redis.asyncio.cluster.ClusterNode(n.host, n.port) for n in nodes]
    twin = redis.asyncio.cluster.RedisCluster(startup_nodes=seeds, **kwargs)
    use_refusal_parser(twin)
    return twin
