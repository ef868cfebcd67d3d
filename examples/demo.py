"""Start a supervisor, admit a mixed workload, watch it drain, then stop with SIGTERM.

Uses the server at ECHOMQ_REDIS_URL; when that is not set, starts a private
Valkey (the ``[valkey]`` extra's binary) on a free port and stops it at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from echomq.supervisor.drills.localredis import LocalRedis

import echomq

queue = f"demo-{uuid.uuid4().hex[:6]}"
server = None
if not os.environ.get("ECHOMQ_REDIS_URL"):
    server = LocalRedis().start()
    os.environ["ECHOMQ_REDIS_URL"] = server.url
    print(f"started a private {os.path.basename(server.binary)} at {server.url}", flush=True)
url = os.environ["ECHOMQ_REDIS_URL"]
sup = subprocess.Popen([sys.executable, "-m", "echomq.supervisor.cli", "start", "--queue", queue,
                        "--handler", "examples.tasks:handle", "--processes", "2",
                        "--beat-ms", "200"])
q = echomq.Queue(queue, redis_url=url)
q.add_many([("resize", {"image": i}, {"lane": f"user-{i % 20}"}) for i in range(5000)])
q.add_many([("flaky", {"n": i}, {"backoff": 0.2}) for i in range(100)])
q.add_many([("resize", {"later": i}, {"delay": 1.5}) for i in range(200)])
print(f"admitted 5,300 jobs to {queue}: 5,000 now, 100 failing once, 200 in 1.5 s", flush=True)
start = time.monotonic()
tick = threading.Event()
while q.counts()["completed"] < 5300 and time.monotonic() - start < 60:
    tick.wait(0.5)  # report progress twice a second
    print(f"{time.monotonic() - start:5.1f}s {q.counts()}", flush=True)
sup.send_signal(signal.SIGTERM)
code = sup.wait(30)
print(f"done: {q.stats()}; supervisor exited with {code}")
ok = q.counts()["completed"] == 5300 and code == 0
if server is not None:
    server.stop()
sys.exit(0 if ok else 1)
