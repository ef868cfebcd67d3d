"""What a newcomer reads from the command lines: every option's default and environment
variable in ``--help``, where a module that cannot be imported was looked for, and which
SQLite file a relative floor URL names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from echomq.supervisor.settings import ENV_VARS

from .conftest import Supervisor

BIN = Path(sys.executable).parent
Start = Callable[..., Supervisor]


def _run(program: str, *args: str, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = BIN / program
    module = {"echomq": "echomq.ops.cli", "echomq-supervisor": "echomq.supervisor.cli"}[program]
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", module]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env if env is not None else dict(os.environ),
                          stdin=subprocess.DEVNULL)


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_start_help_gives_each_option_its_default_and_variable() -> None:
    res = _run("echomq-supervisor", "start", "--help")
    assert res.returncode == 0, res.stderr
    entries: dict[str, str] = {}  # each option's help, from its line and those under it
    for line in res.stdout.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line
        elif line.strip():
            entries[flag] += line
    for name, variable in ENV_VARS.items():
        entry = _flat(entries["--" + name.replace("_", "-")])
        assert re.search(rf"\(default: [^;]+; env {variable}\)", entry), entry
    text = _flat(res.stdout)
    assert "(default: 1000; env ECHOMQ_BEAT_MS)" in text
    assert "(default: redis://127.0.0.1:6379/0; env ECHOMQ_REDIS_URL)" in text
    migrate = _flat(_run("echomq-supervisor", "migrate", "--help").stdout)
    assert "env ECHOMQ_FLOOR_URL" in migrate and "(default: head)" in migrate


def test_echomq_help_gives_the_server_default_and_variable() -> None:
    text = _flat(_run("echomq", "--help").stdout)
    assert "(default: redis://127.0.0.1:6379/0; env ECHOMQ_REDIS_URL)" in text
    assert "(default: 20)" in _flat(_run("echomq", "jobs", "--help").stdout)


@pytest.mark.parametrize("pythonpath", [None, "elsewhere"])
@pytest.mark.parametrize("option", ["--tasks", "--handler"])
def test_a_module_not_found_says_where_it_was_looked_for(
        tmp_path: Path, redis_url: str, option: str, pythonpath: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = str(tmp_path / pythonpath)
    value = "newcomer_tasks" if option == "--tasks" else "newcomer_tasks:handle"
    res = _run("echomq-supervisor", "start", "--redis-url", redis_url, "--queue", "q",
               option, value, cwd=tmp_path, env=env)
    assert res.returncode == 2, res.stderr
    err = _flat(res.stderr)
    assert "No module named 'newcomer_tasks'" in err
    assert f"the working directory ({tmp_path})" in err
    assert f"PYTHONPATH ({tmp_path / pythonpath if pythonpath else 'not set'})" in err
    assert "Traceback" not in res.stderr


def test_an_error_inside_the_module_gives_no_search_hint(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "broken_tasks.py").write_text("import no_such_dependency_here\n")
    res = _run("echomq-supervisor", "start", "--redis-url", redis_url, "--tasks",
               "broken_tasks", cwd=tmp_path)
    assert res.returncode == 2 and "No module named 'no_such_dependency_here'" in res.stderr
    assert "working directory" not in res.stderr  # the module was found; its import failed


def test_a_relative_sqlite_floor_is_resolved_by_migrate_and_start(
        tmp_path: Path, supervisor: Start, redis_url: str, queue_name: str) -> None:
    res = _run("echomq-supervisor", "migrate", "--floor-url", "sqlite:///floor.db", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    absolute = f"sqlite:///{tmp_path / 'floor.db'}"
    assert f"floor {absolute} at revision" in res.stderr, res.stderr
    assert (tmp_path / "floor.db").exists()
    sup = supervisor(redis_url, queue_name, "--floor-url", "sqlite:///floor.db", cwd=tmp_path)
    sup.wait_for_log(rf"floor {re.escape(absolute)}$")
    sup.started(1)
    assert "unreachable" not in sup.log and "migrate" not in sup.log


def test_an_unknown_queue_names_the_server_asked(redis_url: str, queue_name: str) -> None:
    """ECHOMQ_REDIS_URL alone picks the server; a queue not on it says which server that was."""
    env = {**os.environ, "ECHOMQ_REDIS_URL": redis_url}
    res = _run("echomq", "stats", queue_name, env=env)
    assert res.returncode == 1, res.stderr
    host_port = redis_url.split("://", 1)[1].rsplit("@", 1)[-1].split("/", 1)[0]
    assert f"unknown queue {queue_name!r}" in res.stderr and host_port in res.stderr, res.stderr
