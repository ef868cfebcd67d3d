"""``echomq-supervisor`` with the consumers' metrics taken out, for bench/metrics_cost.py.

    .venv/bin/python bench/supervisor_bare.py start --redis-url URL --queue Q ...

The supervisor has no switch for its metrics: every consumer folds each job into the
/metrics histograms (``Observations.fold``, the runner's observer) and sends the folded
counts over its pipe. This entry point takes ``Observations.fold`` away before the
supervisor starts (the forked consumers inherit it), so their runners have no observer
and send no observations; everything else is the stock supervisor.
"""

from __future__ import annotations

import sys

from echomq.supervisor import cli
from echomq.supervisor.observations import Observations

if __name__ == "__main__":
    # a bound method looked up on an instance now reads None: the runner skips its observer
    Observations.fold = None  # type: ignore[assignment,method-assign]
    raise SystemExit(cli.main(sys.argv[1:]))
