"""Tasks for the benchmarks (``--tasks bench_tasks``); the queue comes from BENCH_TASKS_QUEUE."""

from __future__ import annotations

import os

import echomq

QUEUE = os.environ.get("BENCH_TASKS_QUEUE", "bench-tasks")


@echomq.task(queue=QUEUE, name="bench.echo")
def echo(n: int) -> int:
    return n
