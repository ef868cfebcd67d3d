"""`echomq limit`: show and set the queue-wide limit and lane limits."""

from __future__ import annotations

from typing import Any

import echomq


def test_limit_sets_shows_and_clears_the_queue_wide_limit(cli: Any, redis_url: str,
                                                           queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    done = cli("limit", queue_name, "--max-active", "5", "--rate", "100", "--per-s", "2")
    assert done.code == 0 and "max_active 5, rate 100 per 2s" in done.out
    assert q.queue_limit() == {"max_active": 5, "rate": 100, "per_s": 2.0}
    assert cli("limit", queue_name, "--lane", "user-7", "--max-active", "1").code == 0
    shown = cli("limit", queue_name, "--json")
    assert shown.code == 0
    assert shown.json["queue_limit"] == {"max_active": 5, "rate": 100, "per_s": 2.0}
    assert shown.json["lanes"] == {"user-7": {"max_active": 1, "rate": None, "per_s": None}}
    assert cli("limit", queue_name, "--clear").code == 0
    assert q.queue_limit()["max_active"] is None
    assert q.lane_limits()["user-7"]["max_active"] == 1


def test_limit_refuses_bad_values_and_changes_nothing(cli: Any, redis_url: str,
                                                      queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_queue_limit(max_active=3)
    for args in (["--max-active", "0"], ["--max-active", "1000000000"],
                 ["--rate", "5", "--per-s", "0"], ["--max-active", "2", "--clear"]):
        res = cli("limit", queue_name, *args)
        assert res.code == 2 and res.err.startswith("echomq: "), args
    assert q.queue_limit() == {"max_active": 3, "rate": None, "per_s": None}
