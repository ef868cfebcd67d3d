"""The drills of the "durable" dial and the transactional outbox.

==================  ===============================================  ==============================
scenario            fault                                            what the promise says
==================  ===============================================  ==============================
valkey-wipe         FLUSHALL mid-run, the queue on the durable dial  none lost (a job completed
                                                                     within a beat may run again)
producer-crash      a producer commits jobs with tx= and is SIGKILLed every committed job runs, once
                    at once, before it could do anything else
outbox-outage       the application's database (--outbox-url)        none lost, none run twice:
                    unreachable for seconds, committed rows waiting  relays resume after it
==================  ===============================================  ==============================
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import redis
import sqlalchemy as sa
from echomq.supervisor.drills.harness import CLI, MAX_ATTEMPTS, WORK_MS, Harness, JobPlan

from echomq.queue import Queue

OUTBOX_JOBS = 40  # jobs a fault writes through the outbox
OUTAGE_S = 6.0  # longer than SQLite's 5 s busy timeout: the relay's writes must fail

_CRASHING_PRODUCER = textwrap.dedent("""
    import os, signal, sys
    import sqlalchemy as sa
    import echomq
    url, redis_url, queue, attempts, work_ms, *ids = sys.argv[1:]
    engine = sa.create_engine(url)
    q = echomq.Queue(queue, redis_url=redis_url, max_attempts=int(attempts))
    with engine.begin() as conn:
        q.add_many([("drill", {"work_ms": int(work_ms), "fail_first": False},
                     {"job_id": i, "lane": "outbox"}) for i in ids], tx=conn)
    os.kill(os.getpid(), signal.SIGKILL)  # right after the commit, before anything else
""")


def durable_dial(h: Harness) -> None:
    """Setup: the supervisor and the producer on the "durable" dial."""
    h.durability = "durable"


def valkey_wipe(h: Harness) -> None:
    """Scenario: FLUSHALL while jobs are waiting, running and scheduled."""
    h.obs.fault_at = time.time()
    client = redis.Redis.from_url(h.redis.url)
    try:
        client.flushall()
    finally:
        client.close()
    h.obs.fault_end = time.time()


def _outbox_plan(h: Harness, tag: str) -> list[str]:
    """Jobs the fault writes through the outbox, added to the plan the drill judges."""
    ids = [f"{h.queue}-{tag}-{i:04d}" for i in range(OUTBOX_JOBS)]
    h.plan.extend(JobPlan(id=i, lane="outbox", delay=None, fail_first=False) for i in ids)
    return ids


def producer_crash(h: Harness) -> None:
    """Scenario: a producer process commits jobs with tx= and is killed at once."""
    ids = _outbox_plan(h, "tx")
    h.obs.fault_at = time.time()
    done = subprocess.run([sys.executable, "-c", _CRASHING_PRODUCER, h.floor_url, h.redis.url,
                           h.queue, str(MAX_ATTEMPTS), str(WORK_MS), *ids],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    h.obs.fault_end = time.time()
    if done.returncode != -signal.SIGKILL:
        h.obs.notes.append(f"the crashing producer exited {done.returncode}, not by SIGKILL: "
                           f"{done.stderr.strip()[-300:]}")
        return
    h.extra_admitted.update((i, h.obs.fault_end) for i in ids)  # committed: the promise


def app_database(h: Harness) -> None:
    """Setup: the outbox in an application database of its own (a SQLite file in a
    directory the drill owns), migrated by `echomq-supervisor migrate --outbox-url`."""
    app_dir = Path(h.workdir) / "app"
    app_dir.mkdir()
    h.outbox_url = f"sqlite:///{app_dir / 'app.db'}"
    done = subprocess.run([*CLI, "migrate", "--outbox-url", h.outbox_url],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("ECHOMQ_")})
    if done.returncode != 0:
        raise RuntimeError(f"migrate --outbox-url failed: {done.stderr.strip()}")


def outbox_outage(h: Harness) -> None:
    """Scenario: jobs committed into the application database's outbox, which then goes
    away for a while (its write lock held, its directory hidden)."""
    from echomq.supervisor.drills.scenarios import FloorOutage

    assert h.outbox_url is not None
    ids = _outbox_plan(h, "app")
    engine = sa.create_engine(h.outbox_url)
    q = Queue(h.queue, redis_url=h.redis.url, max_attempts=MAX_ATTEMPTS)
    outage = FloorOutage(h.outbox_url, Path(h.workdir) / "app")
    try:
        with engine.begin() as conn:
            q.add_many([("drill", {"work_ms": WORK_MS, "fail_first": False},
                         {"job_id": i, "lane": "outbox"}) for i in ids], tx=conn)
        with engine.connect() as conn:
            pending = conn.scalar(sa.text("SELECT count(*) FROM emq_outbox"))
        h.obs.fault_at = time.time()
        outage.begin()  # at once: the relay runs each beat on SQLite
        h.extra_admitted.update((i, h.obs.fault_at) for i in ids)
        h.obs.notes.append(f"{pending} committed outbox row(s) waiting as the outage began")
    finally:
        engine.dispose()
        q.close()
    try:
        h.pause(OUTAGE_S)
    finally:
        outage.end()
    h.obs.fault_end = time.time()
