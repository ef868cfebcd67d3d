"""One standalone ``echomq.Consumer(...).run()`` process, for the tests that signal or crash it.

    python standalone_proc.py URL QUEUE [--concurrency N] [--async] [--drain-timeout S]
                              [--lease-ms MS] [--ledger-url URL]

Its handler records each start in ``ledger:<queue>:started`` (``id:pid:attempt``) and each
end in ``ledger:<queue>:done`` (on the queue's server, or at ``--ledger-url``). Payload
options: ``sleep`` (s of work), ``exit`` (a code: ``os._exit`` mid-job), ``gate`` (a list
key: the job waits until the test pushes to it), ``linger`` (return a result whose repr,
which the runner asks for after the handler returned, records ``ledger:<queue>:returned``
and then waits for an item in ``ledger:<queue>:go``). The process prints ``ready`` once
the consumer is built and ``ran N`` when ``run()`` returns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import redis

import echomq


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("queue")
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--async", dest="is_async", action="store_true")
    ap.add_argument("--drain-timeout", type=float, default=None)
    ap.add_argument("--lease-ms", type=int, default=None)
    ap.add_argument("--ledger-url", default=None)
    args = ap.parse_args()
    ledger = redis.Redis.from_url(args.ledger_url or args.url)
    started, done = f"ledger:{args.queue}:started", f"ledger:{args.queue}:done"

    def begin(job: echomq.Job) -> dict[str, Any]:
        ledger.rpush(started, f"{job.id}:{os.getpid()}:{job.attempts}")
        payload = job.payload if isinstance(job.payload, dict) else {}
        if "exit" in payload:
            os._exit(int(payload["exit"]))
        if "gate" in payload:
            ledger.blpop([str(payload["gate"])], 60)
        return payload

    class Lingering:
        """A result that is not JSON: the runner encodes its repr, after the handler."""

        def __init__(self, job_id: str) -> None:
            self.job_id = job_id

        def __repr__(self) -> str:
            ledger.rpush(f"ledger:{args.queue}:returned", self.job_id)
            ledger.blpop([f"ledger:{args.queue}:go"])
            return "lingered"

    def handle(job: echomq.Job) -> Any:
        payload = begin(job)
        time.sleep(float(payload.get("sleep", 0)))  # simulated work inside the job
        ledger.rpush(done, job.id)
        return Lingering(job.id) if "linger" in payload else "ok"

    async def handle_async(job: echomq.Job) -> str:
        await asyncio.sleep(float(begin(job).get("sleep", 0)))
        ledger.rpush(done, job.id)
        return "ok"

    extra: dict[str, Any] = {}
    if args.drain_timeout is not None:
        extra["drain_timeout"] = args.drain_timeout
    consumer = echomq.Consumer(args.queue, handle_async if args.is_async else handle,
                               redis_url=args.url, concurrency=args.concurrency,
                               lease_ms=args.lease_ms, **extra)
    print("ready", flush=True)
    ran = consumer.run()
    print(f"ran {ran}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
