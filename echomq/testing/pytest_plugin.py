"""The ``echomq`` pytest plugin (entry point ``pytest11``), loaded once echomq is installed.

Fixtures:

- ``echomq_server`` (session): one Valkey for the whole run, started from the
  ``[valkey]`` extra's embedded binary on a free port (``ECHOMQ_REDIS_URL``, when set,
  names a server to use instead); ``.url``, ``.client()``.
- ``echomq_queue``: a fresh :class:`echomq.Queue` with a name no other test uses, on
  that server; its keys are deleted after the test.
- ``echomq_configured``: ``echomq.configure(redis_url=echomq_server.url)`` for one test,
  so tasks and ``Queue("name")`` without a URL use the test server; undone after.

Nothing here imports echomq or starts anything until a test asks for a fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from echomq.queue import Queue
    from echomq.testing.server import TestServer


@pytest.fixture(scope="session")
def echomq_server() -> Iterator[TestServer]:
    """One Valkey for the test session (or the server ``ECHOMQ_REDIS_URL`` names)."""
    from echomq.errors import MissingExtra
    from echomq.testing.server import TestServer

    try:
        server = TestServer.start()
    except (RuntimeError, MissingExtra) as exc:
        pytest.fail(f"echomq_server: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def echomq_configured(echomq_server: TestServer) -> Iterator[str]:
    """The test server as this process's default (tasks, ``Queue(name)``); its URL."""
    from echomq import pools

    previous = pools._configured_url
    pools.configure(redis_url=echomq_server.url)
    try:
        yield echomq_server.url
    finally:
        pools.configure(redis_url=previous)


@pytest.fixture
def echomq_queue(echomq_server: TestServer) -> Iterator[Queue]:
    """A fresh queue on the test server, removed (every key) after the test."""
    from echomq.queue import Queue
    from echomq.testing.server import remove_queue

    queue = Queue(f"test-{uuid.uuid4().hex[:12]}", redis_url=echomq_server.url)
    try:
        yield queue
    finally:
        try:
            remove_queue(queue)
        finally:
            queue.close()
