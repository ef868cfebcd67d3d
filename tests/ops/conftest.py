"""The ``echomq`` command run as a real subprocess, and helpers that make jobs in each state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import echomq
from echomq.lanes import Lanes, Outcome

CONSOLE_SCRIPT = Path(sys.executable).parent / "echomq"


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(*args: str, url: str | None = None, env: dict[str, str] | None = None) -> Result:
    cmd = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [sys.executable, "-m",
                                                                 "echomq.ops.cli"]
    if url is not None:
        cmd += ["--redis-url", url]
    full_env = {k: v for k, v in os.environ.items() if k != "ECHOMQ_REDIS_URL"}
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60,
                          env={**full_env, **(env or {})}, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def make_dead(q: echomq.Queue, n: int, error: str = "boom: it broke") -> list[str]:
    """Admit n jobs and bury them at once, as a consumer would for an unknown handler
    (call it before admitting other jobs: it claims whatever waits)."""
    ids = q.add_many([("doomed", {"i": i}) for i in range(n)])
    lanes = Lanes(q.redis, q.keys, q.settings)
    claimed = lanes.claim(n)
    assert sorted(c.id for c in claimed) == sorted(ids), "other jobs were waiting"
    lanes.settle([Outcome(c.id, c.token, "d", f"Traceback...\n{error}") for c in claimed])
    return ids


@pytest.fixture
def cli(redis_url: str) -> Any:
    return lambda *args, **kw: run_cli(*args, url=redis_url, **kw)
