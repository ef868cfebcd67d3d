"""What the outbox relay reads from a row: the job's admit, or why it cannot be admitted.

A row written by EchoMQ (``echomq.outbox``) holds JSON ``{"args": [...], "due": ms or
null, "t": token}``, ``args`` being admit.lua's eleven values of one job. A row written
by hand, by another program or damaged may hold anything: it is checked here before its
values reach a script, so one such row is set aside (dead with the reason, see
:func:`set_aside`) instead of failing every batch that reads it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import redis

from echomq import scripts
from echomq.errors import InvalidName
from echomq.keys import Keys, validate_job_id, validate_name

log = logging.getLogger("echomq.relay")
ADMIT_VALUES = 11  # admit.lua's values per job
MAX_DUE_MS = 99_999_999_999_999  # the latest due time schedule.lua stores (ms)
REASON_TEXT_MAX = 2000  # how much of a bad row's text its dead job's error keeps


def parse_row(job_id: str, text: str) -> tuple[tuple[str, list[Any], int | None], str | None] | str:
    """The row's admit spec (id, admit values, due) and token, or why it has none."""
    try:
        row = json.loads(text)
        args, due, token = row["args"], row["due"], row.get("t")
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        return f"does not parse ({type(exc).__name__}: {exc})"
    if not isinstance(args, list) or len(args) != ADMIT_VALUES or args[0] != job_id:
        return f"holds no admit of job {job_id!r} ({ADMIT_VALUES} values, its id first)"
    if any(isinstance(a, bool) or not isinstance(a, str | int) for a in args):
        return "holds an admit value that is neither text nor an integer"
    _, name, payload, lane, attempts, stalls, _, _, _, _, priority = args
    try:
        validate_name(lane, "lane name")
    except InvalidName as exc:
        return f"names an invalid lane ({exc})"
    if not isinstance(name, str) or not name or len(name) > 255 or not isinstance(payload, str):
        return "holds no job name or no payload text"
    if not isinstance(attempts, int) or attempts < 1 or not isinstance(stalls, int) \
            or stalls < 0 or priority not in tuple("0123456789"):
        return "holds an invalid max_attempts, max_stalls or priority"
    if due is not None and (isinstance(due, bool) or not isinstance(due, int)
                            or not 0 <= due <= MAX_DUE_MS):
        return f"holds a due time that is not an integer from 0 to {MAX_DUE_MS} ms"
    if token is not None and not isinstance(token, str):
        return "holds a token that is not text"
    return (job_id, args, due), token


def set_aside(client: redis.Redis, keys: Keys, queue: str,
              bad: Sequence[tuple[int, str, str, str]]) -> None:
    """Bad rows (row id, job id, text, why) leave the outbox with their batch: each job
    is dead at once, its error naming the row, why, and the row's text; an id that is
    taken already keeps its job (this row's admit would have changed nothing); a row
    whose job id is no job id is logged whole."""
    pairs = []
    for row_id, job_id, text, why in bad:
        try:
            validate_job_id(job_id)
        except InvalidName:
            log.error("queue %s: outbox row %d dropped: its job id %r is no job id, and it "
                      "%s; the row was: %s", queue, row_id, job_id, why, text)
            continue
        if client.exists(keys.job(job_id)):
            log.error("queue %s: outbox row %d of job %s dropped: it %s, and the job "
                      "exists already; the row was: %s", queue, row_id, job_id, why, text)
            continue
        reason = f"outbox row {row_id} {why}: {text[:REASON_TEXT_MAX]}"
        log.error("queue %s: job %s set aside dead: %s", queue, job_id, reason)
        pairs += [job_id, reason]
    if pairs:
        scripts.BURY(client, [keys.schedule, keys.dead, keys.stats, keys.spilled,
                              keys.events], [keys.prefix, *pairs])
