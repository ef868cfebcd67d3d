"""One default server per process: ``configure()``'s URL, else ``ECHOMQ_REDIS_URL``, else the
local default, for ``Queue``, ``aio.Queue``, ``add_many``, tasks and their results alike."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import echomq
from echomq import pools
from echomq.connection import DEFAULT_URL


@pytest.fixture
def configured(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    assert redis_url != DEFAULT_URL  # the session's server is on a port of its own
    monkeypatch.delenv(pools.ENV_URL, raising=False)
    echomq.configure(redis_url=redis_url)
    yield redis_url
    echomq.configure(redis_url=None)


def test_a_queue_without_a_url_uses_the_configured_server(configured: str,
                                                          queue_name: str) -> None:
    q = echomq.Queue(queue_name)
    assert q.where == configured
    job_id = q.add("x", {"n": 1})
    assert echomq.Queue(queue_name, redis_url=configured).get(job_id) is not None
    ids = echomq.add_many({queue_name: [("y", 2)]})[queue_name]
    assert echomq.Queue(queue_name, redis_url=configured).get(ids[0]) is not None


def test_an_aio_queue_without_a_url_uses_the_configured_server(configured: str,
                                                               queue_name: str) -> None:
    async def admit() -> str:
        q = echomq.aio.Queue(queue_name)
        try:
            assert q.where == configured
            return await q.add("x", {"n": 1})
        finally:
            await q.close()

    job_id = asyncio.run(admit())
    assert echomq.Queue(queue_name, redis_url=configured).get(job_id) is not None


def test_an_explicit_url_still_wins(configured: str) -> None:
    assert echomq.Queue("q", redis_url="redis://127.0.0.1:1/0").where == "redis://127.0.0.1:1/0"


def test_a_process_with_the_environment_variable_uses_it(redis_url: str,
                                                         queue_name: str) -> None:
    code = (
        "import asyncio, echomq\n"
        f"q = echomq.Queue({queue_name!r})\n"
        "print(q.add('x', 1))\n"
        "async def a():\n"
        f"    aq = echomq.aio.Queue({queue_name!r})\n"
        "    jid = await aq.add('y', 2)\n"
        "    await aq.close()\n"
        "    return jid\n"
        "print(asyncio.run(a()))\n"
    )
    env = {**os.environ, pools.ENV_URL: redis_url}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    ids = proc.stdout.split()
    assert len(ids) == 2
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert all(q.get(job_id) is not None for job_id in ids)


def test_configured_defaults_are_the_settings_of_queues_made_without_their_own(
        configured: str, queue_name: str) -> None:
    echomq.configure(redis_url=configured, defaults={"max_attempts": 7, "keep_completed": 5})
    q = echomq.Queue(queue_name)
    assert q.get(q.add("x", {})).max_attempts == 7
    assert q.settings.keep_completed == 5
    assert echomq.Queue(queue_name, max_attempts=2).settings.max_attempts == 2  # its own wins
    assert echomq.aio.Queue(queue_name).settings.max_attempts == 7
    given = echomq.QueueSettings(max_attempts=4)
    assert echomq.Queue(queue_name, settings=given).settings.max_attempts == 4
    # a bad default changes nothing: the server and the defaults stay as they were
    for bad in ({"max_attempt": 7}, {"max_attempts": 0}):
        with pytest.raises(echomq.ConfigError):
            echomq.configure(redis_url="redis://elsewhere:1/0", defaults=bad)
        assert pools.default_url() == configured
        assert echomq.Queue(queue_name).settings.max_attempts == 7
    echomq.configure(redis_url=configured)  # no defaults: the built-in settings again
    assert echomq.Queue(queue_name).settings == echomq.QueueSettings()
