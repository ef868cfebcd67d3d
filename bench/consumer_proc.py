"""One standalone ``echomq.Consumer(...).run()`` process, for the benchmarks.

    python bench/consumer_proc.py --redis-url URL --queue Q --handler handlers:noop [--burst]

SIGTERM calls ``Consumer.stop()``; the process prints how many jobs it ran.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import echomq  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--handler", default="handlers:noop")
    ap.add_argument("--burst", action="store_true")
    ap.add_argument("--beat-ms", type=int, default=None)
    ap.add_argument("--doorbell", choices=("list", "marker"), default="list")
    args = ap.parse_args()
    module, _, attr = args.handler.partition(":")
    handler = getattr(importlib.import_module(module), attr)
    consumer = echomq.Consumer(args.queue, handler, redis_url=args.redis_url,
                               beat_ms=args.beat_ms, doorbell=args.doorbell)
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
    ran = consumer.run(burst=args.burst)
    print(f"ran {ran} jobs", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
