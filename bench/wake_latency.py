"""The machine's wake-up floor under every latency figure: how long a process parked on a
socket takes to run again.

    .venv/bin/python bench/wake_latency.py              # 200 samples, 20 ms apart
    .venv/bin/python bench/wake_latency.py --json -

On a private server: a forked process parks in ``BLPOP``; every ``--gap-ms`` another
pushes the time it pushed, and the parked one records how late it woke. Between pushes
the pusher times a ``PING`` on its idle connection (the server asleep, as for a pickup's
claim). A pickup through the supervisor waits for five such wake-ups, huey's for two.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import benchlib as bl
import redis


def measure(samples: int, gap_s: float) -> dict[str, float]:
    with bl.private_redis() as server:
        pid = os.fork()
        if pid == 0:  # the parked process
            try:
                c = redis.Redis.from_url(server.url)
                for _ in range(samples):
                    _, sent = c.blpop(["bench:wake"], 10)  # type: ignore[misc]
                    c.rpush("bench:late", f"{time.time() - float(sent):.6f}")
            finally:
                os._exit(0)
        r = bl.client(server.url)
        pause = threading.Event()
        pings = []
        bl.wait_until(lambda: len(r.client_list(_type="normal")) >= 2, 10,
                      what="the parked process")
        for _ in range(samples):
            pause.wait(gap_s)
            t = time.perf_counter()
            r.ping()
            pings.append((time.perf_counter() - t) * 1000)
            r.lpush("bench:wake", f"{time.time():.6f}")
        os.waitpid(pid, 0)
        late = [float(x) * 1000 for x in r.lrange("bench:late", 0, -1)]
    return {"blpop_wake_p50_ms": bl.pct(late, 50), "blpop_wake_p90_ms": bl.pct(late, 90),
            "idle_ping_p50_ms": bl.pct(pings, 50), "idle_ping_p90_ms": bl.pct(pings, 90)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    res = measure(args.samples, args.gap_ms / 1000)
    bl.print_table(f"Wake-ups, {args.samples} samples {args.gap_ms:g} ms apart (ms)",
                   ["what", "p50", "p90"],
                   [["BLPOP woken by another process's LPUSH", f"{res['blpop_wake_p50_ms']:.3f}",
                     f"{res['blpop_wake_p90_ms']:.3f}"],
                    ["PING on an idle connection", f"{res['idle_ping_p50_ms']:.3f}",
                     f"{res['idle_ping_p90_ms']:.3f}"]])
    bl.emit_json(args.json, {"bench": "wake_latency", **res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
