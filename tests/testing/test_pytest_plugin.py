"""The echomq pytest plugin, as an installed project's own test run sees it: a pytest
subprocess on a small test file, in a directory outside this repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis

import echomq
from echomq.testing.server import remove_queue

EXAMPLE = '''
import os

import echomq
from echomq.testing import run_jobs

seen = {}


@echomq.task(queue="plugin-emails")
def send_email(to: str, subject: str) -> str:
    return f"sent {subject!r} to {to}"


def test_one(echomq_server, echomq_queue):
    seen["server"] = echomq_server
    seen["queue"] = echomq_queue.name
    echomq_queue.add("double", 21)
    [job] = run_jobs(echomq_queue, lambda job: job.payload * 2, raise_on_failure=True)
    assert (job.state, job.result) == ("completed", 42)
    with open(os.environ["PLUGIN_OUT"], "a") as out:
        print(echomq_server.url, echomq_server.embedded, echomq_queue.name, file=out)


def test_two_shares_the_server_and_gets_a_fresh_queue(echomq_server, echomq_queue):
    assert echomq_server is seen["server"]
    assert echomq_queue.name != seen["queue"]
    client = echomq_server.client()
    assert client.keys("emq:{" + seen["queue"] + "}:*") == []  # the first one was removed


def test_a_task(echomq_configured):
    jid = send_email.send("a@b.c", subject="hi")
    [job] = run_jobs("plugin-emails", raise_on_failure=True)
    assert job.id == jid and job.result == "sent 'hi' to a@b.c"


def test_failures_read_plainly(echomq_queue):
    echomq_queue.add("charge", {"order": 7}, max_attempts=1)

    def charge(job):
        raise RuntimeError("card declined")

    run_jobs(echomq_queue, charge, raise_on_failure=True)
'''


def _pytest(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_example.py").write_text(EXAMPLE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "test_example.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ECHOMQ_", "PYTEST_"))}
    env.update(PLUGIN_OUT=str(tmp_path / "out.txt"), **extra)
    return env


def test_the_plugin_starts_an_embedded_server_and_gives_fresh_queues(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _env(tmp_path))
    out = done.stdout + done.stderr
    assert "1 failed, 3 passed" in out, out
    # the failure reads as an assertion naming the job and its error
    assert "JobsFailed: 1 job(s) failed:" in out and "'charge'" in out, out
    assert "RuntimeError: card declined" in out, out
    url, embedded, _ = (tmp_path / "out.txt").read_text().split()
    assert embedded == "True"
    # the embedded server ended with the session
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
        raise AssertionError(f"{url} still answers after the run")
    except redis.ConnectionError:
        pass


def test_the_plugin_uses_the_server_echomq_redis_url_names(tmp_path: Path,
                                                           redis_url: str) -> None:
    done = _pytest(tmp_path, _env(tmp_path, ECHOMQ_REDIS_URL=redis_url))
    assert "1 failed, 3 passed" in done.stdout, done.stdout + done.stderr
    url, embedded, queue = (tmp_path / "out.txt").read_text().split()
    assert (url, embedded) == (redis_url, "False")
    client = redis.Redis.from_url(redis_url)
    assert client.ping()  # left running
    assert client.keys("emq:{" + queue + "}:*") == []
    tasks_queue = echomq.Queue("plugin-emails", redis_url=redis_url)
    try:
        assert tasks_queue.counts()["waiting"] == 0  # run_jobs ran the task's job
    finally:
        remove_queue(tasks_queue)
