"""A consumer that never gets ready is ended after ``--boot-timeout`` and forked again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import echomq

from .conftest import wait_until


def test_a_consumer_stuck_before_ready_is_ended_and_another_runs_the_jobs(
        supervisor: Any, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    mark = tmp_path / "first-boot"
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jobs = [q.add("w", {"n": i}) for i in range(3)]
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--boot-timeout", "1",
                     "--middleware", "sup_boot:StuckOnce",
                     env={"ECHOMQ_TEST_BOOT_MARK": str(mark)})
    [ended] = sup.wait_for_log(r"not ready after 1 s; ending it", timeout=30)
    stuck = int(mark.read_text())
    assert f"consumer {stuck} not ready" in ended
    sup.wait_for_log(rf"consumer {stuck} killed by SIGKILL", timeout=15)
    wait_until(lambda: q.counts()["completed"] == len(jobs), 30,
               "the jobs run by the next consumer")
    assert sup.log.count("not ready after") == 1, "only the stuck consumer was ended"


def test_boot_timeout_must_be_positive(supervisor: Any, redis_url: str, queue_name: str) -> None:
    sup = supervisor(redis_url, queue_name, "--boot-timeout", "0")
    assert sup.wait() == 2
    assert "boot_timeout must be > 0" in sup.log
