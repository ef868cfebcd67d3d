"""The Node client (clients/node) built and tested from scratch: ``npm ci``, ``npm run
build`` (which copies echomq/lua into the package) and ``npm test`` (node's test runner,
against a private server of the binary this suite uses and the Python supervisor of this
checkout). Skipped, saying so, where node or npm is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from echomq.supervisor.drills.localredis import server_binary

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "node"


@pytest.mark.timeout(900)
def test_node_client_builds_and_passes_its_tests() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm not installed: the Node client's tests (clients/node) did not run")
    binary = server_binary()
    if binary is None:
        pytest.skip("no redis-server/valkey-server binary for the Node client's tests")
    env = {**os.environ, "ECHOMQ_PYTHON": sys.executable, "ECHOMQ_VALKEY_SERVER": binary}
    for command in (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build"],
                    ["npm", "test"]):
        done = subprocess.run(command, cwd=PACKAGE, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0, (
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-6000:]}\n"
            f"{done.stderr[-3000:]}")
