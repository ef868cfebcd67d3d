"""Start a supervisor, admit a mixed workload, watch it drain, then stop with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import echomq

queue = f"demo-{uuid.uuid4().hex[:6]}"
url = os.environ["ECHOMQ_REDIS_URL"]
sup = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "start", "--queue", queue,
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
sys.exit(0 if q.counts()["completed"] == 5300 and code == 0 else 1)
