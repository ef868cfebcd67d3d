"""The consumer side of codemojex: score one guess and record the player's best.

Run by the supervisor as ``examples.codemojex.handler:score_guess``. Each
guess costs a little CPU (deriving the hidden row) and a little I/O (a call
to a profile service, simulated by a 2 ms wait, and one script on Valkey that
keeps the best score, logs when the guess was scored and announces a new best).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from echomq import Job
from examples.codemojex.game import FLOODER, GameKeys, score, secret

PROFILE_CALL_S = 0.002

# KEYS[1] best zset, KEYS[2] scored list; ARGV: player, score, created_ms, channel.
# Times come from the server's clock, the same clock that stamped created_ms at admit.
RECORD = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('RPUSH', KEYS[2], ARGV[3] .. ':' .. now)
local changed = redis.call('ZADD', KEYS[1], 'GT', 'CH', ARGV[2], ARGV[1])
if changed == 1 then redis.call('PUBLISH', ARGV[4], ARGV[1] .. ' ' .. ARGV[2]) end
return changed
"""

_client: tuple[int, Any] | None = None


def _record() -> Any:
    """The record script on a client of this process (handlers run in forked children)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        url = os.environ.get("ECHOMQ_REDIS_URL", "redis://127.0.0.1:6379/0")
        _client = (os.getpid(), redis.Redis.from_url(url).register_script(RECORD))
    return _client[1]


def score_guess(job: Job) -> dict[str, Any]:
    """Score ``{"game", "player", "guess"}``; returns the points and whether it is a new best."""
    game, player, guess = job.payload["game"], job.payload["player"], job.payload["guess"]
    points = score(secret(game), guess)
    time.sleep(PROFILE_CALL_S)
    keys = GameKeys(game)
    scored = keys.flood if player == FLOODER else keys.players
    best = _record()(keys=[keys.best, scored],
                     args=[player, points, job.created_ms, keys.channel])
    return {"points": points, "new_best": bool(best)}
