"""The process's default server: ``echomq.configure(redis_url=...)``, else
``ECHOMQ_REDIS_URL``, else the local default. ``Queue``, ``aio.Queue``,
``add_many``, tasks and their results use it when given no URL of their own.

One client (one connection pool) per URL per process. A forked child never
reuses its parent's sockets: the tables are emptied in the child right after
``fork`` (and checked against the pid on every use, for forks that bypass the
hooks). asyncio clients are kept per event loop, since their connections
belong to the loop that opened them.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

from echomq.config import QueueSettings
from echomq.connection import DEFAULT_URL, client_from_url

if TYPE_CHECKING:
    from echomq import aio
    from echomq.queue import Queue

ENV_URL = "ECHOMQ_REDIS_URL"

_configured_url: str | None = None
_defaults = QueueSettings()
_pid = os.getpid()
_clients: dict[str, redis.Redis] = {}
_queues: dict[tuple[str, str], Queue] = {}
_Loop = asyncio.AbstractEventLoop
_aio_clients: weakref.WeakKeyDictionary[_Loop, dict[str, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary())
_aio_queues: weakref.WeakKeyDictionary[_Loop, dict[tuple[str, str], aio.Queue]] = (
    weakref.WeakKeyDictionary())


def configure(*, redis_url: str | None = None,
              defaults: Mapping[str, Any] | None = None) -> None:
    """Set this process's default server: where ``Queue``, ``aio.Queue``, tasks and results
    given no ``redis_url`` of their own connect (None: ``ECHOMQ_REDIS_URL``, else the local
    default), and ``defaults``: :class:`~echomq.QueueSettings` fields (``max_attempts``,
    ``backoff``, ``keep_completed``...) of every queue made without ``settings=`` (its own
    keyword arguments still win). Queues made before the call keep what they were made
    with. An unknown or invalid setting raises ConfigError and changes nothing."""
    global _configured_url, _defaults
    settings = QueueSettings().with_overrides(**dict(defaults or {}))
    _configured_url = redis_url
    _defaults = settings
    _forget()


def default_settings() -> QueueSettings:
    """The settings :func:`configure` gave every queue made without its own."""
    return _defaults


def default_url() -> str:
    """The configured URL, else ``ECHOMQ_REDIS_URL``, else the local default."""
    return _configured_url or os.environ.get(ENV_URL) or DEFAULT_URL


def client(url: str | None = None) -> redis.Redis:
    """This process's client for ``url`` (default: :func:`default_url`)."""
    _check_pid()
    url = url or default_url()
    found = _clients.get(url)
    if found is None:
        found = _clients[url] = client_from_url(url)
    return found


def queue(name: str, url: str | None = None) -> Queue:
    """This process's Queue for ``name`` on ``url``, sharing :func:`client`'s pool."""
    from echomq.queue import Queue

    _check_pid()
    url = url or default_url()
    found = _queues.get((name, url))
    if found is None:
        found = _queues[(name, url)] = Queue(name, redis=client(url))
    return found


def aio_queue(name: str, url: str | None = None) -> aio.Queue:
    """The running event loop's asyncio Queue for ``name`` on ``url`` (one pool per loop)."""
    from echomq import aio

    _check_pid()
    url = url or default_url()
    loop = asyncio.get_running_loop()
    queues = _aio_queues.setdefault(loop, {})
    found = queues.get((name, url))
    if found is None:
        clients = _aio_clients.setdefault(loop, {})
        shared = clients.get(url)
        if shared is None:
            shared = clients[url] = aio.client_from_url(url)
        found = queues[(name, url)] = aio.Queue(name, redis=shared)
    return found


def _check_pid() -> None:
    if os.getpid() != _pid:
        _after_fork()


def _forget() -> None:
    _clients.clear()
    _queues.clear()
    _aio_clients.clear()
    _aio_queues.clear()


def _after_fork() -> None:
    """In a forked child: drop (never close) the parent's clients; new ones are made on use."""
    global _pid
    _pid = os.getpid()
    _forget()


os.register_at_fork(after_in_child=_after_fork)
