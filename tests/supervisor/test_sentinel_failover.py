"""A Sentinel-managed primary (redis+sentinel:// URLs): the supervisor and producers
find the primary through Sentinel and follow a failover without a restart."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis, free_port, server_binary

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]
SERVICE = "echomq"


@pytest.fixture
def sentinel_pair(tmp_path: Path) -> Iterator[tuple[LocalRedis, LocalRedis, int]]:
    """A primary, its replica, and one Sentinel watching them (quorum 1)."""
    binary = server_binary()
    if binary is None:
        pytest.skip("needs a valkey-server/redis-server binary")
    primary = LocalRedis().start()
    replica = LocalRedis(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"  # Sentinel rewrites its own file: a private copy
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 10000\n")
    sentinel = subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        yield primary, replica, port
    finally:
        sentinel.send_signal(signal.SIGTERM)
        sentinel.wait(10)
        replica.stop()
        primary.stop()


def _primary_port(sentinel_port: int) -> int | None:
    try:
        addr = redis.Redis(port=sentinel_port, socket_timeout=2).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
    except redis.exceptions.ConnectionError:
        return None
    return int(addr[1]) if addr else None


def _sentinel_knows_the_replica(sentinel_port: int, replica_port: int) -> bool:
    """Sentinel lists the replica as healthy: only then can it fail over to it (it
    learns replicas from the primary's INFO, which it reads every 10 s)."""
    try:
        replicas = redis.Redis(port=sentinel_port, socket_timeout=2, decode_responses=True
                               ).execute_command("SENTINEL", "REPLICAS", SERVICE)
    except redis.exceptions.ConnectionError:
        return False
    for entry in replicas:
        if isinstance(entry, list):
            entry = dict(zip(entry[::2], entry[1::2], strict=True))
        fields = entry
        if (int(fields.get("port", 0)) == replica_port
                and fields.get("master-link-status") == "ok"
                and "disconnected" not in fields.get("flags", "")):
            return True
    return False


def _answers(q: echomq.Queue) -> bool:
    try:
        q.ping()
    except echomq.ConnectionFailed:
        return False
    return True


def _done(r: redis.Redis, queue: str) -> set[str]:
    return {x.decode() for x in r.lrange(f"ledger:{queue}:done", 0, -1)}


def test_supervisor_and_producer_follow_a_sentinel_failover(
        supervisor: Start, sentinel_pair: tuple[LocalRedis, LocalRedis, int], redis_url: str,
        queue_name: str, r: redis.Redis) -> None:
    primary, replica, sentinel_port = sentinel_pair
    wait_until(lambda: _primary_port(sentinel_port) == primary.port, 15, "Sentinel to watch")
    url = f"redis+sentinel://127.0.0.1:{sentinel_port}/{SERVICE}/0"
    # the ledger lives on the session server, which no failover touches
    supervisor(redis_url, queue_name, "--redis-url", url, "--queue", queue_name,
               "--handler", "sup_jobs:record", "--beat-ms", "200", flags=False).started(1)
    q = echomq.Queue(queue_name, redis_url=url)
    before = [q.add("x", {}) for _ in range(5)]
    wait_until(lambda: set(before) <= _done(r, queue_name), 20, "jobs before the failover")

    wait_until(lambda: _sentinel_knows_the_replica(sentinel_port, replica.port), 30,
               "Sentinel to list the replica as a failover candidate")
    primary.kill()
    wait_until(lambda: _primary_port(sentinel_port) == replica.port, 30, "the failover")
    # until Sentinel has seen the new primary report its role, clients get a clear
    # ConnectionFailed ("No master found"); producers retry as for any outage
    wait_until(lambda: _answers(q), 30, "the new primary to be usable")
    after = [q.add("x", {}) for _ in range(5)] + [q.add("x", {}, delay=0.2)]
    wait_until(lambda: set(after) <= _done(r, queue_name), 30, "jobs after the failover")
    assert redis.Redis(port=replica.port).info("replication")["role"] == "master"
