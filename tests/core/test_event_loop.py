"""The consumer's event loop: uvloop when installed (or asked for), asyncio otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter

import pytest
import redis

import echomq
from echomq import loops

KINDS = {"asyncio": "asyncio", "uvloop": "uvloop"}  # ECHOMQ_EVENT_LOOP -> loop module root


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("concurrency", [1, 8])
def test_async_jobs_run_on_the_chosen_loop(kind: str, concurrency: int, redis_url: str,
                                           queue_name: str, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setenv(loops.LOOP_ENV, kind)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", {"n": i}) for i in range(40)])
    seen: Counter[str] = Counter()

    async def handler(job: echomq.Job) -> int:
        await asyncio.sleep(0.001)
        seen[type(asyncio.get_running_loop()).__module__.split(".")[0]] += 1
        return int(job.payload["n"])

    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url,
                               concurrency=concurrency)
    assert consumer.run(burst=True) == 40
    assert seen == {KINDS[kind]: 40}
    assert [q.result(i, timeout=5) for i in ids] == list(range(40))


def test_auto_takes_uvloop_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.setenv(loops.LOOP_ENV, "auto")
    assert loops.loop_kind() == "uvloop"
    monkeypatch.delenv(loops.LOOP_ENV)
    assert loops.loop_kind() == "uvloop"
    loop = loops.new_event_loop()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loops.LOOP_ENV, "auto")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import of it fails, as uninstalled
    assert loops.loop_kind() == "asyncio"
    monkeypatch.setenv(loops.LOOP_ENV, "uvloop")
    with pytest.raises(echomq.ConfigError, match="uvloop is not installed"):
        loops.loop_kind()


def test_an_unknown_loop_is_a_clear_error_and_nothing_runs(
        redis_url: str, queue_name: str, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loops.LOOP_ENV, "trio")
    with pytest.raises(echomq.ConfigError, match="ECHOMQ_EVENT_LOOP must be one of"):
        echomq.Consumer(queue_name, lambda job: None, redis_url=redis_url, concurrency=4)
    done = subprocess.run(
        [sys.executable, "-m", "echomq.supervisor.cli", "start", "--redis-url", redis_url,
         "--queue", queue_name, "--handler", "builtins:print", "--concurrency", "4"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "ECHOMQ_EVENT_LOOP must be one of" in done.stderr
