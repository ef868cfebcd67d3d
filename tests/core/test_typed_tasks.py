"""Typed tasks: ``send`` follows the function's signature; mypy --strict on examples/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# imported modules are taken as given, as they are for an installed package
MYPY = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental"]

WRONG_CALLS = '''
from examples.typed_tasks import build_report, send_email

send_email.send(42, subject="hi")
send_email.options(delay=5).send("a@b.c")
send_email.send("a@b.c", "hi", urgent="yes")


async def report() -> int:
    return await build_report.asend(7, "2026-11")
'''


def _mypy(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MYPY, *paths], cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_mypy_strict_passes_on_the_typed_example() -> None:
    done = _mypy("examples/typed_tasks.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_flags_calls_that_do_not_match_the_task(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_calls.py"
    wrong.write_text(WRONG_CALLS)
    done = _mypy(str(wrong))
    assert done.returncode == 1
    for needle in ('"send" of "Task" has incompatible type "int"; expected "str"',
                   'Missing positional argument "subject" in call to "send" of "TaskCall"',
                   'Argument "urgent" to "send" of "Task" has incompatible type "str"',
                   'Incompatible return value type (got "str", expected "int")'):
        assert needle in done.stdout, done.stdout
