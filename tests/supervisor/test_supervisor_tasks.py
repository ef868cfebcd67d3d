"""``echomq-supervisor start --tasks``: tasks by name in real forked consumers."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import redis

import echomq

from . import sup_tasks
from .conftest import CLI, ROOT, Supervisor

Start = Callable[..., Supervisor]


@pytest.fixture
def tasks(redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[ModuleType]:
    """sup_tasks with this test's queues, and send() pointed at the test server."""
    monkeypatch.setenv("SUP_TASKS_QUEUE", queue_name)
    monkeypatch.setenv("SUP_TASKS_QUEUE2", queue_name + "-2")
    echomq.configure(redis_url=redis_url)
    yield importlib.reload(sup_tasks)
    echomq.configure(redis_url=None)


def _env(queue_name: str) -> dict[str, str]:
    return {"SUP_TASKS_QUEUE": queue_name, "SUP_TASKS_QUEUE2": queue_name + "-2"}


def _start(supervisor: Start, redis_url: str, queue_name: str, *args: str) -> Supervisor:
    sup = supervisor(redis_url, queue_name, "--redis-url", redis_url, "--beat-ms", "200",
                     *args, env=_env(queue_name), flags=False)
    return sup


def test_tasks_run_by_name_with_per_task_retries(supervisor: Start, redis_url: str,
                                                 queue_name: str, tasks: ModuleType) -> None:
    _start(supervisor, redis_url, queue_name, "--queue", queue_name, "--tasks", "sup_tasks",
           "--processes", "2").started(2)
    assert tasks.add.result(tasks.add.send(2, b=3), timeout=15) == 5
    lucky = tasks.third_time_lucky.send("k1")
    assert tasks.third_time_lucky.result(lucky, timeout=15) == "ok on attempt 3"
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.get(lucky).attempts == 3  # type: ignore[union-attr]
    doomed = tasks.always_fails.send()
    with pytest.raises(echomq.JobFailed, match="no such mailbox") as info:
        q.result(doomed, timeout=15)
    assert "ValueError" in info.value.error
    assert q.get(doomed).attempts == 2  # type: ignore[union-attr]


def test_an_unknown_job_name_goes_dead_with_a_clear_error(supervisor: Start, redis_url: str,
                                                          queue_name: str,
                                                          tasks: ModuleType) -> None:
    _start(supervisor, redis_url, queue_name, "--queue", queue_name,
           "--tasks", "sup_tasks").started(1)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("sup.nobody", {"args": [], "kwargs": {}})
    with pytest.raises(echomq.JobFailed, match="unknown handler 'sup.nobody'"):
        q.result(jid, timeout=15)
    assert q.get(jid).attempts == 1  # type: ignore[union-attr]


def test_without_queue_every_queue_its_tasks_name_is_served(supervisor: Start, redis_url: str,
                                                            queue_name: str,
                                                            tasks: ModuleType) -> None:
    sup = _start(supervisor, redis_url, queue_name, "--tasks", "sup_tasks")
    sup.started(2)  # one consumer per queue
    assert tasks.add.result(tasks.add.send(1, 1), timeout=15) == 2
    assert tasks.where.result(tasks.where.send(), timeout=15) == queue_name + "-2"


def test_tasks_and_handler_together(supervisor: Start, redis_url: str, queue_name: str,
                                    tasks: ModuleType, r: redis.Redis) -> None:
    _start(supervisor, redis_url, queue_name, "--queue", queue_name, "--tasks", "sup_tasks",
           "--handler", "sup_jobs:record").started(1)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    plain = q.add("not-a-task", {})
    assert q.result(plain, timeout=15) == "ok"  # sup_jobs:record's return value
    assert tasks.add.result(tasks.add.send(4, 5), timeout=15) == 9


def test_tasks_from_the_environment(supervisor: Start, redis_url: str, queue_name: str,
                                    tasks: ModuleType) -> None:
    env = {**_env(queue_name), "ECHOMQ_REDIS_URL": redis_url, "ECHOMQ_QUEUE": queue_name,
           "ECHOMQ_TASKS": "sup_tasks", "ECHOMQ_BEAT_MS": "200"}
    supervisor(redis_url, queue_name, env=env, flags=False).started(1)
    assert tasks.add.result(tasks.add.send(20, 22), timeout=15) == 42


@pytest.mark.parametrize("modules, needle", [
    ("sup_broken_tasks", "cannot import task module 'sup_broken_tasks'"),
    ("sup_tasks,no_such_tasks_xyz", "cannot import task module 'no_such_tasks_xyz'"),
])
def test_a_task_module_that_fails_to_import_makes_start_exit_2(redis_url: str, modules: str,
                                                               needle: str) -> None:
    for queue_flags in ([], ["--queue", "q"]):
        t0 = time.monotonic()
        done = subprocess.run([*CLI, "start", "--redis-url", redis_url, *queue_flags,
                               "--tasks", modules], cwd=ROOT, capture_output=True, text=True,
                              timeout=30, env={"PYTHONPATH": f"{ROOT}/tests/supervisor:{ROOT}",
                                               "PATH": "/usr/bin:/bin"})
        assert done.returncode == 2, done.stderr
        assert needle in done.stderr
        assert time.monotonic() - t0 < 10


def test_a_queue_with_no_tasks_and_no_handler_is_refused(redis_url: str) -> None:
    done = subprocess.run([*CLI, "start", "--redis-url", redis_url, "--queue", "empty-q",
                           "--tasks", "sup_tasks"], cwd=ROOT, capture_output=True, text=True,
                          timeout=30, env={"PYTHONPATH": f"{ROOT}/tests/supervisor:{ROOT}",
                                           "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "no task of --tasks sup_tasks is on it" in done.stderr


# --- these need per-job timeouts and async handlers in the consumers ---------------------

NEEDS_EXEC = pytest.mark.skipif(
    not hasattr(echomq, "Retry"),  # arrives with per-job time limits and async handlers
    reason="the consumer does not enforce per-job time limits or await async handlers yet")


@NEEDS_EXEC
def test_a_task_timeout_is_enforced_through_the_supervisor(supervisor: Start, redis_url: str,
                                                           queue_name: str,
                                                           tasks: ModuleType) -> None:
    _start(supervisor, redis_url, queue_name, "--queue", queue_name,
           "--tasks", "sup_tasks").started(1)
    jid = tasks.slow.send(3.0)
    t0 = time.monotonic()
    with pytest.raises(echomq.JobFailed, match="timed out"):
        tasks.slow.result(jid, timeout=2.5)
    assert time.monotonic() - t0 < 2.0


@NEEDS_EXEC
def test_an_async_task_runs_through_the_supervisor(supervisor: Start, redis_url: str,
                                                   queue_name: str, tasks: ModuleType) -> None:
    _start(supervisor, redis_url, queue_name, "--queue", queue_name,
           "--tasks", "sup_tasks").started(1)
    assert tasks.async_double.result(tasks.async_double.send(21), timeout=10) == 42


def test_tasks_from_a_config_file(supervisor: Start, redis_url: str, queue_name: str,
                                  tasks: ModuleType, tmp_path: object) -> None:
    from pathlib import Path

    config = Path(str(tmp_path)) / "echomq.toml"
    config.write_text(f'[[queues]]\nname = "{queue_name}"\ntasks = "sup_tasks"\nprocesses = 1\n')
    supervisor(redis_url, queue_name, "--redis-url", redis_url, "--config", str(config),
               env=_env(queue_name), flags=False).started(1)
    assert tasks.add.result(tasks.add.send(1, 2), timeout=15) == 3


HUP_TASKS = '''
import os

import echomq

VERSION = {version}


@echomq.task(queue=os.environ["SUP_TASKS_QUEUE"], name="hup.version")
def version() -> int:
    return VERSION
'''


def test_sighup_reloads_task_modules(supervisor: Start, redis_url: str, queue_name: str,
                                     tmp_path: object) -> None:
    from pathlib import Path

    from .conftest import HERE

    folder = Path(str(tmp_path))
    (folder / "hup_tasks.py").write_text(HUP_TASKS.format(version=1))
    env = {**_env(queue_name), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": f"{folder}{os.pathsep}{HERE}{os.pathsep}{ROOT}"}
    sup = supervisor(redis_url, queue_name, "--redis-url", redis_url, "--queue", queue_name,
                     "--tasks", "hup_tasks", env=env, flags=False).started(1)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    call = {"args": [], "kwargs": {}}
    assert q.result(q.add("hup.version", call), timeout=15) == 1
    (folder / "hup_tasks.py").write_text(HUP_TASKS.format(version=2))
    sup.signal(signal.SIGHUP)
    sup.wait_for_log(r"SIGHUP: rolling")
    sup.wait_for_log(r"consumer \d+ started", 2)
    assert q.result(q.add("hup.version", call), timeout=15) == 2
