"""One peer's async admit rate: N concurrent producers on one event loop awaiting its
enqueue, until the shared count is reached. Run under the peer's virtualenv (it needs
only the peer's package and the standard library); prints one JSON line.

    python admit_peer.py arq|saq URL JOBS PRODUCERS [--saq-ops N]

Each system at its documented settings for a producer (its own Redis client from the
URL): arq ``create_pool(RedisSettings.from_dsn(url))`` and ``enqueue_job`` (default
serializer, pickle; arq has no bulk enqueue); SAQ ``Queue.from_url`` with
``max_concurrent_ops`` (its throttle on concurrent ``enqueue`` calls, 20 by default) and
``enqueue``. Every job is checked to be queued once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def _producers(send: Callable[[int], Awaitable[Any]], jobs: int, producers: int
                     ) -> float:
    left = iter(range(jobs))

    async def producer() -> None:
        for n in left:
            await send(n)

    t0 = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    return time.perf_counter() - t0


async def arq_rate(url: str, jobs: int, producers: int) -> tuple[float, int]:
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings.from_dsn(url))
    try:
        elapsed = await _producers(lambda n: pool.enqueue_job("noop", n), jobs, producers)
        queued = await pool.zcard("arq:queue")
    finally:
        await pool.aclose()
    return elapsed, int(queued)


async def saq_rate(url: str, jobs: int, producers: int, ops: int) -> tuple[float, int]:
    from saq import Queue

    q = Queue.from_url(url, name="admit", max_concurrent_ops=ops)
    await q.connect()
    try:
        elapsed = await _producers(lambda n: q.enqueue("noop", n=n), jobs, producers)
        queued = await q.redis.llen("saq:admit:queued")  # type: ignore[attr-defined]
    finally:
        await q.disconnect()
    return elapsed, int(queued)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("system", choices=("arq", "saq"))
    ap.add_argument("url")
    ap.add_argument("jobs", type=int)
    ap.add_argument("producers", type=int)
    ap.add_argument("--saq-ops", type=int, default=20)
    args = ap.parse_args()
    if args.system == "arq":
        elapsed, queued = asyncio.run(arq_rate(args.url, args.jobs, args.producers))
    else:
        elapsed, queued = asyncio.run(saq_rate(args.url, args.jobs, args.producers,
                                               args.saq_ops))
    if queued != args.jobs:
        raise SystemExit(f"{args.system}: {queued} queued, expected {args.jobs}")
    print(json.dumps({"system": args.system, "jobs_per_s": args.jobs / elapsed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
