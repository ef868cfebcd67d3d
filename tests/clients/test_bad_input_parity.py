"""The bad-input table both clients run (cases.json; the Node side in
clients/node/test/parity.test.mjs): the same error class and message for the same input,
and nothing admitted."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from echomq.keys import Keys

CASES = json.loads((Path(__file__).parent / "cases.json").read_text(encoding="utf-8"))["cases"]


def materialize(value: Any) -> Any:
    """A case's value with its special forms ($nan, $set, ...) made real."""
    if isinstance(value, list):
        return [materialize(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (key, arg), = value.items()
        if key == "$nan":
            return float("nan")
        if key == "$inf":
            return float("inf")
        if key == "$circular":
            loop: list[Any] = []
            loop.append(loop)
            return loop
        if key == "$set":
            return set(arg)
        if key == "$datetime":
            return datetime.fromisoformat(arg.replace("Z", "+00:00"))
        if key == "$deep":
            deep: Any = 1
            for _ in range(arg):
                deep = [deep]
            return deep
        if key == "$repeat":
            return arg[0] * arg[1]
    return {k: materialize(v) for k, v in value.items()}


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_bad_input_case(case: dict[str, Any], redis_url: str, r: redis.Redis,
                        queue_name: str) -> None:
    keys = Keys(queue_name)
    if "protocol" in case:
        r.hset(keys.meta, "protocol", case["protocol"])

    def call() -> list[str]:
        if case.get("call") == "queue":
            echomq.Queue(materialize(case["queue"]), redis_url=redis_url)
            return []
        q = echomq.Queue(queue_name, redis_url=redis_url)
        if case.get("call") == "add_many":
            return q.add_many([tuple(materialize(job)) for job in case["jobs"]])
        return [q.add(materialize(case.get("name", "job")), materialize(case.get("payload")),
                      **materialize(case.get("options", {})))]

    if case["error"] == "ok":
        for job_id in call():
            assert r.hget(keys.job(job_id), "state") in (b"waiting", b"scheduled", b"blocked")
        return
    with pytest.raises(Exception) as info:
        call()
    assert type(info.value).__name__ == case["error"], info.value
    message = str(info.value)
    if "message" in case:
        assert message == case["message"].replace("{queue}", queue_name)
    else:
        assert re.search(case["match"].replace("{queue}", re.escape(queue_name)), message), message
    assert r.exists(keys.ring, keys.schedule, keys.lane("default"), keys.waitdeps,
                    keys.prefix + "expiring") == 0
