"""The codemojex example on a real supervisor: lanes keep a flood from starving players.

The same round is played twice on the session's server: once with a lane per
player, once with every guess in one lane (a FIFO queue). Normal players'
guesses arrive while the flooder's backlog is still draining, so under FIFO
each waits behind what the flood left ahead of it; with lanes it waits for a
turn of the ring. The bound is a share of the flood's own drain time in the
same run, so a slower machine moves both sides together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# 2 processes at ~2.5 ms a guess drain at most ~800 guesses/s: 3,000 take >= 3.7 s, so
# every normal guess (sent within 1.5 s) arrives while the flood is still queued
ROUND = ["--players", "30", "--guesses", "3", "--flood", "3000", "--window", "1.5",
         "--processes", "2", "--timeout", "120", "--json"]


def play(redis_url: str, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "ECHOMQ_REDIS_URL": redis_url}
    env.pop("ECHOMQ_FLOOR_URL", None)
    queue = f"guesses-{uuid.uuid4().hex[:8]}"
    done = subprocess.run([sys.executable, "-m", "examples.codemojex.play", *ROUND,
                           "--queue", queue, *extra], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_lanes_keep_normal_players_p99_under_a_bound_fifo_cannot_meet(redis_url: str) -> None:
    lanes = play(redis_url)
    fifo = play(redis_url, "--single-lane")
    for result in (lanes, fifo):
        assert result["normal"]["scored"] == 90
        assert result["flooder"]["scored"] == 3000
        assert result["players_on_board"] == 31  # 30 players and the flooder
    bound_ms = lanes["flood_drain_ms"] / 4
    assert lanes["normal"]["p99_ms"] < bound_ms, lanes
    # the same round on one lane: the players' guesses queue behind the flood
    assert fifo["normal"]["p99_ms"] > fifo["flood_drain_ms"] / 4, fifo
    assert fifo["normal"]["p99_ms"] > 5 * lanes["normal"]["p99_ms"], (lanes, fifo)
    # with lanes the flooder still gets its guesses scored, just after its own backlog
    assert lanes["flooder"]["p50_ms"] > lanes["normal"]["p99_ms"]


def test_scoring_follows_the_rules() -> None:
    sys.path.insert(0, str(ROOT))
    from examples.codemojex.game import EXACT, PRESENT, SOLVED, score, secret

    hidden = secret("g1")
    assert hidden == secret("g1") and len(hidden) == 6
    assert score(hidden, hidden) == SOLVED
    rotated = hidden[1:] + hidden[0]
    exact = sum(a == b for a, b in zip(hidden, rotated, strict=True))
    assert score(hidden, rotated) == exact * EXACT + (6 - exact) * PRESENT
