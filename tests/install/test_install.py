"""The install: the producer needs only the base install, extras are named when missing, and
the demo runs with nothing listening at :6379 and no redis-server on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from echomq.supervisor.drills.localredis import embedded_valkey

REPO = Path(__file__).resolve().parents[2]

BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"sqlalchemy", "alembic", "psutil"}:
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None
    sys.meta_path.insert(0, Block())
""")


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def test_base_install_admits_without_sqlalchemy_alembic_or_psutil(redis_url: str) -> None:
    done = _run("""
        import sys, echomq
        q = echomq.Queue("install-base", redis_url=URL)
        jid = q.add("x", {"n": 1})
        assert q.get(jid).state == "waiting"
        assert not {"sqlalchemy", "alembic", "psutil"} & set(sys.modules), sorted(sys.modules)
        print("ok")
    """.replace("URL", repr(redis_url)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_add_cron_without_croniter_names_the_cron_extra(redis_url: str) -> None:
    block = BLOCK.replace('{"sqlalchemy", "alembic", "psutil"}', '{"croniter"}')
    assert block != BLOCK
    code = textwrap.dedent("""
        import uuid, echomq
        q = echomq.Queue("install-cron-" + uuid.uuid4().hex[:8], redis_url=URL)
        try:
            q.add_cron("nightly", "0 3 * * *", "report")
        except echomq.MissingExtra as exc:
            print(exc)
        assert q.crons() == []  # nothing stored
    """).replace("URL", repr(redis_url))
    done = subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'echomq[cron]'" in done.stdout and "croniter" in done.stdout


@pytest.mark.parametrize(("module", "extra"), [("echomq.supervisor", "supervisor"),
                                               ("echomq.floor", "floor"),
                                               ("echomq.supervisor.cli", "supervisor")])
def test_missing_extra_names_the_extra_to_install(module: str, extra: str) -> None:
    done = _run(f"""
        import echomq
        try:
            import {module}
        except echomq.MissingExtra as exc:
            print(exc)
        else:
            raise SystemExit("imported without its extra")
    """)
    assert done.returncode == 0, done.stderr
    assert f"pip install 'echomq[{extra}]'" in done.stdout
    assert "sqlalchemy" in done.stdout


def test_installed_packages_do_not_claim_supervisor_or_migrations() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = project["tool"]["setuptools"]["packages"]
    assert all(p == "echomq" or p.startswith("echomq.") for p in packages), packages


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs root and unshare for a private network namespace")
def test_demo_runs_with_nothing_at_6379_and_no_redis_server_on_path(tmp_path: Path) -> None:
    assert embedded_valkey(), "the [valkey] extra is part of [test]"
    bindir = tmp_path / "bin"  # PATH holds this interpreter and its scripts only
    bindir.mkdir()
    (bindir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bindir / "python").chmod(0o755)
    (bindir / "echomq-supervisor").symlink_to(Path(sys.executable).parent / "echomq-supervisor")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(PATH=str(bindir), ECHOMQ_FLOOR_URL=f"sqlite:///{tmp_path}/floor.sqlite3")
    script = (f"/usr/sbin/ip link set lo up && "
              f"! python -c 'import socket; socket.create_connection((\"127.0.0.1\", 6379), 1)' "
              f"2>/dev/null && ! command -v redis-server && ! command -v valkey-server && "
              f"echomq-supervisor migrate && python {REPO}/examples/demo.py")
    unshare = shutil.which("unshare") or "unshare"
    done = subprocess.run([unshare, "--net", "/bin/sh", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "started a private valkey-server" in done.stdout
    assert "supervisor exited with 0" in done.stdout
