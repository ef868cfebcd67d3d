"""Celery's chord on the same kind of server, for bench/workflows.py's comparison.

    /path/to/celery-venv/bin/python bench/peers/chord_celery.py --url redis://... \
        --members 10000 [--crash] [--acks-late] [--timeout 120]

Starts ``celery worker -c 2`` (prefork) on this module, sends ``chord(noop x N, total)``
and waits for the callback. ``--crash``: one member ``os._exit(1)``s its worker process
on its first run (a counter in Redis tells runs apart), as EchoMQ's drill members do.
``--acks-late``: ``task_acks_late`` and ``task_reject_on_worker_lost`` (redelivery of a
task whose process died); Celery's defaults otherwise. Prints one JSON line: seconds
to the callback (or None when it never ran), and how many times the callback ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import redis
from celery import Celery, chord

URL = os.environ.get("CHORD_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("chord_celery", broker=URL, backend=URL)
app.conf.update(task_serializer="json", accept_content=["json"], result_serializer="json",
                broker_connection_retry_on_startup=True,
                task_acks_late=os.environ.get("CHORD_ACKS_LATE") == "1",
                task_reject_on_worker_lost=os.environ.get("CHORD_ACKS_LATE") == "1")


@app.task(name="noop")
def noop(i: int, crash: bool = False) -> int:
    if crash and redis.Redis.from_url(URL).incr("chord:crash-runs") == 1:
        os._exit(1)  # the worker process dies mid-task, on its first run only
    return 1


@app.task(name="total")
def total(values: list[int]) -> int:
    redis.Redis.from_url(URL).incr("chord:callback-runs")
    return sum(values)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--crash", action="store_true")
    ap.add_argument("--acks-late", action="store_true")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    env = {**os.environ, "CHORD_REDIS_URL": args.url, "CHORD_ACKS_LATE": "1" if args.acks_late
           else "0", "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    if env["CHORD_REDIS_URL"] != URL:  # this process's app must speak to the same server
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    r = redis.Redis.from_url(args.url)
    r.flushall()
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "chord_celery", "worker",
                               "-c", "2", "--loglevel", "WARNING"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        noop.delay(-1).get(timeout=60)  # the worker is up: its boot is not measured
        t0 = time.perf_counter()
        crash_at = args.members // 2 if args.crash else -1
        result = chord(noop.s(i, i == crash_at) for i in range(args.members))(total.s())
        try:
            value = result.get(timeout=args.timeout)
            took: float | None = time.perf_counter() - t0
        except Exception as exc:  # ChordError, TimeoutError: the callback did not run
            value, took = repr(exc)[:120], None
        time.sleep(2.0)  # a late second run of the callback would show here
        print(json.dumps({"system": "celery", "members": args.members, "crash": args.crash,
                          "acks_late": args.acks_late, "seconds": took, "value": value,
                          "callback_runs": int(r.get("chord:callback-runs") or 0)}))
    finally:
        worker.terminate()
        worker.wait(30)


if __name__ == "__main__":
    main()
