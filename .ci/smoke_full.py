"""Run from the installed wheel: migrate, start on a handler, a few jobs, SIGTERM, exit 0."""

import os
import signal
import subprocess
import sys
import tempfile
import threading

import supervisor.options  # supervisord's package, importable beside EchoMQ  # noqa: F401
from echomq.supervisor.drills.localredis import LocalRedis

import echomq

assert "site-packages" in echomq.__file__, echomq.__file__
floor = f"sqlite:///{tempfile.mkdtemp()}/floor.sqlite3"
subprocess.run(["echomq-supervisor", "migrate", "--floor-url", floor], check=True)
server = LocalRedis().start()
try:
    env = {**os.environ, "ECHOMQ_REDIS_URL": server.url, "ECHOMQ_FLOOR_URL": floor}
    sup = subprocess.Popen(["echomq-supervisor", "start", "--queue", "smoke", "--handler",
                            "smoke_jobs:handle", "--processes", "2", "--beat-ms", "200"], env=env)
    q = echomq.Queue("smoke", redis_url=server.url)
    ids = q.add_many([("n", {"n": i}) for i in range(20)])
    done = threading.Event()
    for _ in range(300):  # up to 30 s for 20 jobs
        if q.counts()["completed"] == 20:
            break
        done.wait(0.1)
    assert q.counts()["completed"] == 20, q.counts()
    assert q.get(ids[3]).result == {"n": 3}
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(30) == 0
finally:
    server.stop()
print("smoke: installed supervisor migrated, ran 20 jobs and drained on SIGTERM")
sys.exit(0)
