"""The server a test suite runs on: an embedded Valkey of its own, or ``ECHOMQ_REDIS_URL``."""

from __future__ import annotations

import os

import redis

from echomq.keys import REGISTRY, Keys
from echomq.queue import Queue

ENV_URL = "ECHOMQ_REDIS_URL"


class TestServer:
    """A Valkey/Redis server for tests: ``.url``; :meth:`stop` ends it if it was started
    here (a server named by ``ECHOMQ_REDIS_URL`` is left running)."""

    __test__ = False  # not a test class, whatever pytest collects

    def __init__(self, url: str, local: object | None = None) -> None:
        self.url = url
        self._local = local

    @classmethod
    def start(cls) -> TestServer:
        """``ECHOMQ_REDIS_URL`` when set, else a private Valkey from the ``[valkey]`` extra
        (or ``valkey-server``/``redis-server`` on PATH) on a free port; starting one needs
        the ``[testing]`` extra (MissingExtra otherwise)."""
        url = os.environ.get(ENV_URL)
        if url:
            return cls(url)
        from echomq.supervisor.drills.localredis import LocalRedis

        local = LocalRedis().start()
        return cls(local.url, local)

    @property
    def embedded(self) -> bool:
        """True when this server was started for the tests (and ends with them)."""
        return self._local is not None

    def client(self) -> redis.Redis:
        """A new client on the server."""
        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        """End the server if it was started here."""
        if self._local is not None:
            self._local.stop()  # type: ignore[attr-defined]
            self._local = None

    def __repr__(self) -> str:
        return f"TestServer({self.url!r}, embedded={self.embedded})"


def remove_queue(queue: Queue) -> int:
    """Delete every key of ``queue`` and its name from the registry; returns keys deleted.
    Meant for tests: jobs, results, schedule, crons and limits go."""
    keys: Keys = queue.keys
    client = queue.redis
    removed = 0
    batch: list[bytes] = []
    pattern = keys.prefix.replace("[", "\\[").replace("?", "\\?").replace("*", "\\*") + "*"
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += int(client.unlink(*batch))
            batch = []
    if batch:
        removed += int(client.unlink(*batch))
    client.srem(REGISTRY, queue.name)
    return removed
