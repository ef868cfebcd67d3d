"""A concurrent drain's answer to a cancel: find which of its jobs were cancelled while it
held them, cancel the coroutines among them and hand back the unstarted ones.

stop.lua empties a cancelled job's token, so a held pair whose token the job hash no
longer carries is no longer this consumer's: one pipelined read of the tokens tells. A
sync handler running in a thread cannot be stopped here: under the supervisor its process
is ended; a standalone consumer stops it at its next ``job.progress()``.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from echomq.connection import UNAVAILABLE_ERRORS
from echomq.stopping import CANCELLED_TEXT

if TYPE_CHECKING:
    from echomq.concurrent import ConcurrentDrain

log = logging.getLogger("echomq.consumer")


async def stale_check(drain: ConcurrentDrain) -> None:
    """Cancel the drain's coroutines, and drop its buffered jobs, whose tokens went stale.
    Runs on the drain's loop."""
    client = getattr(drain, "aclient", None)
    pairs = list(drain.coroutines) + [(c.id, c.token) for c, _ in drain.buffer]
    if client is None or not pairs:
        return
    pipe = client.pipeline(transaction=False)
    for job_id, _ in pairs:
        pipe.hget(drain.lanes.keys.job(job_id), "token")
    try:
        tokens = await pipe.execute()
    except UNAVAILABLE_ERRORS as exc:  # the stop is recorded; the handler ends when it ends
        log.warning("queue %s: could not check for cancelled jobs: %s",
                    drain.lanes.keys.queue, exc)
        return
    stale = {pair for pair, token in zip(pairs, tokens, strict=True)
             if (token.decode() if isinstance(token, bytes) else token) != pair[1]}
    if not stale:
        return
    for pair in stale & drain.coroutines:
        task = drain.in_flight.get(pair)
        if task is not None:
            task.cancel(CANCELLED_TEXT)  # the runner knows it by this text: not a failure
    kept = deque(item for item in drain.buffer if (item[0].id, item[0].token) not in stale)
    if len(kept) != len(drain.buffer):
        # refused by the release script (stale tokens), and dropped from the holdings
        drain.handback += [(c.id, c.token) for c, _ in drain.buffer
                           if (c.id, c.token) in stale]
        drain.buffer = kept
    drain._set_wake()
