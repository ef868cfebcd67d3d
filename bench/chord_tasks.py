"""Tasks of bench/workflow_peers.py's EchoMQ chord (``--tasks chord_tasks``); the queue
comes from BENCH_CHORD_QUEUE, the server from BENCH_REDIS_URL."""

from __future__ import annotations

import os

import redis

import echomq

QUEUE = os.environ.get("BENCH_CHORD_QUEUE", "bench-chord")
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:  # built after the fork, in the consumer process
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    return _client


@echomq.task(queue=QUEUE, name="bench.chord.noop")
def noop(i: int, crash: bool = False) -> int:
    """A member; ``crash``: its first run ends its process (a counter tells runs apart)."""
    if crash and _redis().incr("chord:crash-runs") == 1:
        os._exit(1)
    return 1


@echomq.task(queue=QUEUE, name="bench.chord.total")
def total(values: list[int]) -> int:
    """The callback: counts its runs, sums the members' results."""
    _redis().incr("chord:callback-runs")
    return sum(values)
