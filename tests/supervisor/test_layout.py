"""The supervisor's runtime stands apart from its tooling: no runtime module imports the
drills package (the ``drill`` subcommand loads it when called), and the arbiter stays the
loop and its wiring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import echomq.supervisor

SUPERVISOR = Path(echomq.supervisor.__file__).parent
# the compatibility modules that re-export the local server helpers from the drills
COMPAT = {"localredis", "localcluster"}


def test_no_runtime_module_imports_the_drills() -> None:
    runtime = sorted(p.stem for p in SUPERVISOR.glob("*.py")
                     if p.stem not in COMPAT | {"__init__", "__main__"})
    assert {"arbiter", "children", "cli", "worker"} <= set(runtime)
    code = ("import importlib, sys\n"
            f"for name in {runtime!r}:\n"
            "    importlib.import_module('echomq.supervisor.' + name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('echomq.supervisor.drills')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_drill_command_loads_the_drills_when_called() -> None:
    out = subprocess.run([sys.executable, "-m", "echomq.supervisor.cli", "drill", "no-such"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no-such" in out.stderr, out.stderr


def test_the_arbiter_stays_the_loop_and_its_wiring() -> None:
    lines = len((SUPERVISOR / "arbiter.py").read_text().splitlines())
    assert lines <= 500, f"arbiter.py has {lines} lines: move a role into a module of its own"
