"""``echomq-supervisor`` with the consumers' metrics taken out, for bench/metrics_cost.py.

    .venv/bin/python bench/supervisor_bare.py start --redis-url URL --queue Q ...

The supervisor has no switch for its metrics: every consumer folds each job into the
/metrics histograms (``TimedRunner``) and sends the folded counts over its pipe. This
entry point replaces ``TimedRunner`` in the worker module with a pass-through before
the supervisor starts (the forked consumers inherit it), so its consumers run the bare
runner and send no observations; everything else is the stock supervisor.
"""

from __future__ import annotations

import sys
from typing import Any

from echomq.supervisor import cli, worker


def _bare(runner: Any, _observations: Any) -> Any:
    return runner


if __name__ == "__main__":
    worker.TimedRunner = _bare  # type: ignore[assignment,misc]
    raise SystemExit(cli.main(sys.argv[1:]))
