"""The service's tasks, run by the supervisor:

    echomq-supervisor start --tasks examples.fastapi.tasks
"""

from __future__ import annotations

import os
import time

import echomq

QUEUE = os.environ.get("REPORTS_QUEUE", "reports")


@echomq.task(queue=QUEUE, max_attempts=3)
def build_report(rows: int, seconds_per_row: float = 0.0) -> dict[str, int]:
    """Build a report of ``rows`` rows, reporting progress after each one."""
    if rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    job = echomq.current_job()
    total = 0
    for row in range(rows):
        time.sleep(seconds_per_row)  # the work of one row
        total += row
        if job is not None:
            job.progress({"done": row + 1, "of": rows})
    return {"rows": rows, "total": total}
