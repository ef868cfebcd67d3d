"""Mutation check: apply one-line mutants to the protocol and the supervisor, run the tests
that guard each, and report which mutants the suite caught.

    python tools/mutate.py                  # every mutant in tools/mutants.toml
    python tools/mutate.py --only restore   # mutants whose id contains "restore"
    python tools/mutate.py --list

A mutant is caught when its tests fail. Each test selection is first run unmutated: a
selection that fails on the clean tree makes the check fail rather than count as caught.
The source is mutated in place and always restored (even on Ctrl-C), so run it on a clean
checkout and do not edit the tree meanwhile. Exit code 0 when every mutant is caught.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTANTS = Path(__file__).with_name("mutants.toml")
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutant:
    """One source change: ``find`` (exactly once in ``file``) becomes ``replace``."""

    id: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str


def load(path: Path = MUTANTS) -> list[Mutant]:
    """The mutants of the list file, checked: each ``find`` occurs exactly once."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    mutants = [Mutant(m["id"], m["file"], m["find"], m["replace"], tuple(m["tests"]),
                      m.get("why", "")) for m in raw["mutant"]]
    ids = [m.id for m in mutants]
    if len(ids) != len(set(ids)):
        raise SystemExit("mutants.toml: duplicate ids")
    stale = []
    for m in mutants:
        count = (REPO / m.file).read_text(encoding="utf-8").count(m.find)
        if count != 1:
            stale.append(f"mutant {m.id}: {m.find!r} occurs {count} times in {m.file}")
    if stale:
        raise SystemExit("\n".join(stale) + "\n(the source changed: update these mutants)")
    return mutants


def run_tests(tests: tuple[str, ...]) -> tuple[bool, float]:
    """Run a test selection; (passed, seconds)."""
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             *tests], cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=TIMEOUT_S)
        passed = done.returncode == 0
    except subprocess.TimeoutExpired:
        passed = False  # a hang under a mutant counts as caught: the suite noticed
    return passed, time.monotonic() - t0


def apply(m: Mutant) -> str:
    """Write the mutant into its file; returns the original text to restore."""
    path = REPO / m.file
    original = path.read_text(encoding="utf-8")
    path.write_text(original.replace(m.find, m.replace, 1), encoding="utf-8")
    return original


def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 when every selected mutant was caught."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the mutants whose id contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    mutants = [m for m in load() if not args.only or args.only in m.id]
    if args.list:
        for m in mutants:
            print(f"{m.id:<28} {m.file}: {m.why}")
        return 0
    for tests in sorted({m.tests for m in mutants}):
        ok, secs = run_tests(tests)
        print(f"baseline {'ok  ' if ok else 'FAIL'} {secs:6.1f} s  {' '.join(tests)}", flush=True)
        if not ok:
            print("a selection fails on the clean tree: fix it before mutating", file=sys.stderr)
            return 2
    survivors = []
    for m in mutants:
        original = apply(m)
        try:
            passed, secs = run_tests(m.tests)
        finally:
            (REPO / m.file).write_text(original, encoding="utf-8")
        print(f"{'SURVIVED' if passed else 'caught  '} {secs:6.1f} s  {m.id}: {m.why}",
              flush=True)
        if passed:
            survivors.append(m.id)
    caught = len(mutants) - len(survivors)
    print(f"mutation score: {caught}/{len(mutants)} caught"
          + (f"; survived: {', '.join(survivors)}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
