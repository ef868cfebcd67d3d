"""``echomq show`` and ``echomq jobs`` with dependencies: what a job waits for, what waits
for it, and the blocked state (a subprocess on a real server)."""

from __future__ import annotations

from typing import Any

import echomq


def test_show_prints_both_sides_of_a_dependency(cli: Any, redis_url: str,
                                                queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    a = q.add("a", job_id="first")
    b = q.add("b", job_id="second", after=[a])
    c = q.add("c", job_id="third", after=[b])
    shown = cli("show", queue_name, b)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert "blocked" in shown.out
    assert lines[lines.index("waits for:") + 1].split() == [a, "waiting"]
    assert lines[lines.index("waited by:") + 1].split() == [c, "blocked"]
    record = cli("--json", "show", queue_name, b).json
    assert (record["state"], record["after"], record["dependents"]) == ("blocked", [a], [c])
    listing = cli("--json", "jobs", queue_name, "--state", "blocked").json
    assert [j["id"] for j in listing["jobs"]] == [b, c]
    counts = cli("--json", "stats", queue_name).json
    assert counts["blocked"] == 2
