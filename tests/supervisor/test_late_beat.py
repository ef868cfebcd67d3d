"""A scheduler whose beat comes late says so: a supervisor held still (SIGSTOP) for many
beats logs "scheduler-late" with the gap once it runs again, and /metrics counts it
(its folds and closes lagged as long, and the durability windows grew with them)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from echomq.supervisor.drills.localredis import free_port

from echomq.floor import Floor

from .conftest import Supervisor, wait_until

HELD_S = 1.0  # the fault's length: ten beats of 100 ms


def test_a_beat_begun_late_is_logged_with_its_gap_and_counted(
        redis_url: str, queue_name: str, tmp_path: Path,
        supervisor: Callable[..., Supervisor]) -> None:
    floor_url = f"sqlite:///{tmp_path / 'floor.db'}"
    with Floor.from_url(floor_url) as floor:
        floor.upgrade()
    port = free_port()
    sup = supervisor(redis_url, queue_name, "--floor-url", floor_url, "--beat-ms", "100",
                     "--health-port", str(port), "--log-json").started(1)
    sup.wait_for_log("this replica now runs the scheduler")
    before = len(re.findall('"scheduler-late"', sup.log))
    stopped = time.time()
    os.kill(sup.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(HELD_S)  # the fault itself: the supervisor held still this long
    finally:
        resumed = time.time()
        os.kill(sup.proc.pid, signal.SIGCONT)
    lines = sup.wait_for_log('"scheduler-late"', before + 1)
    late = [json.loads(line) for line in lines[before:]]
    # the span the line names (the last beat's start, then the gap) covers the stop
    assert any(x["since"] <= stopped and x["since"] + x["gap_s"] >= resumed
               and x["gap_s"] >= HELD_S and x["queue"] == queue_name for x in late), late

    def late_beats() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        found = re.search(rf'echomq_floor_late_beats_total{{queue="{queue_name}"}} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    wait_until(lambda: late_beats() >= 1, 10, "the late beat counted in /metrics")
