"""Where the time from an outbox commit to the handler's start goes, hop by hop (PostgreSQL).

    .venv/bin/python bench/outbox_hops.py --jobs 300 [--durable]

A private redis-server, a throwaway database on the local PostgreSQL, and a supervisor
with one consumer process serving the queue (no floor: it only runs the jobs). The relay
runs in this process as the supervisor runs it: the real :class:`Listener` pokes a real
``SchedulerThread`` whose scheduler relays the outbox. Each job is added alone in its own
transaction, once the previous one started; its stamps (``time.time()``, comparable across
the processes of one machine):

- commit: when the job's ``COMMIT`` returned to the producer (the clock's zero);
- notify: the LISTEN connection handed the NOTIFY to the listener;
- relay: the scheduler thread began the relay;
- select: the relay's first round trip returned (``BEGIN`` and the ``SELECT`` of the rows,
  on a connection of its own pool, which tests none at checkout);
- floor: (``--durable``) the floor rows were committed;
- admit: the admit script returned (the consumer's doorbell is rung inside it);
- start: the handler started (``handlers:started`` in the consumer process);
- done: the relay's second round trip returned (the ``DELETE`` of the rows and ``COMMIT``).

Printed: p50 and p99 of each stamp's time since the commit (ms).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import benchlib as bl
from durable import make_floor
from echomq.supervisor import relay as relay_mod
from echomq.supervisor.relay import Listener, Relay, open_outbox
from echomq.supervisor.scheduler import Scheduler, SchedulerThread

import echomq
from echomq.floor import Floor

STAMPS = ("notify", "relay", "select", "floor", "admit", "done", "start")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--durable", action="store_true",
                    help="the durable dial: the relay writes floor rows before the admit")
    args = ap.parse_args(argv)
    floor_url, drop = make_floor("postgresql")
    try:
        with bl.private_redis() as server:
            run(server.url, floor_url, args.jobs, args.durable)
    finally:
        drop()
    return 0


def run(url: str, floor_url: str, jobs: int, durable: bool) -> None:
    name = bl.unique_queue("hops")
    proc = bl.start_supervisor(url, name, "handlers:started", 1, beat_ms=100)
    client = bl.client(url)
    client.delete("bench:start")
    floor = Floor.from_url(floor_url) if durable else None
    engine = open_outbox(floor_url, None)
    assert engine is not None
    stamps: dict[str, float] = {}

    def stamp(what: str) -> None:
        stamps.setdefault(what, time.time())

    real_admit = Relay._admit

    def timed_admit(self: Relay, *a: Any, **kw: Any) -> Any:
        stamp("select")  # the rows are here: BEGIN and the SELECT returned
        return real_admit(self, *a, **kw)

    Relay._admit = timed_admit  # type: ignore[method-assign]
    real_execute = relay_mod.scripts.execute
    real_write = relay_mod.durable.write_before_admit

    def timed_execute(*a: Any, **kw: Any) -> Any:
        out = real_execute(*a, **kw)
        stamp("admit")
        return out

    def timed_write(*a: Any, **kw: Any) -> Any:
        out = real_write(*a, **kw)
        stamp("floor")
        return out

    relay_mod.scripts.execute = timed_execute  # type: ignore[assignment]
    relay_mod.durable.write_before_admit = timed_write  # type: ignore[assignment]
    scheduler = Scheduler(name, bl.client(url), floor, beat_ms=100, horizon_s=3600)
    scheduler.durable = durable
    scheduler.relay = Relay(name, scheduler.client, engine)
    real_run = scheduler.relay.run

    def timed_run(*a: Any, **kw: Any) -> int:
        began = time.time()
        n = real_run(*a, **kw)
        if n:  # not a beat's relay that found nothing
            stamps.setdefault("relay", began)
            stamp("done")
        return n

    scheduler.relay.run = timed_run  # type: ignore[method-assign]
    thread = SchedulerThread(scheduler)
    listener = Listener(engine, lambda queue: (stamp("notify"), thread.poke()))
    listener.start()
    q = echomq.Queue(name, redis_url=url)
    producer = open_outbox(floor_url, None)
    assert producer is not None
    rows: list[dict[str, float]] = []
    try:
        bl.wait_until(lambda: listener.connected.is_set() and scheduler.fence is not None, 30,
                      what="the listener and the leadership", proc=proc)
        for i in range(-20, jobs):  # the first 20 warm up
            with producer.connect() as conn:
                conn.begin()
                q.add("x", {"i": i}, tx=conn)
                stamps.clear()
                conn.commit()
                commit = time.time()
            reply = client.blpop(["bench:start"], 30)
            if reply is None:
                raise TimeoutError(f"job {i} did not start within 30 s\n{proc.tail()}")
            job_i, started = reply[1].decode().split()
            assert int(job_i) == i
            # the relay's commit may end after the handler started: wait for it
            bl.wait_until(lambda: "done" in stamps, 30, 0.0005, "the relay's commit")
            stamps["start"] = float(started)
            if i >= 0:
                rows.append({k: (v - commit) * 1000 for k, v in stamps.items()})
    finally:
        listener.close()
        thread.close()
        proc.stop()
        engine.dispose()
        producer.dispose()
        q.close()
        if floor is not None:
            floor.dispose()
    present = [s for s in STAMPS if all(s in r for r in rows)]
    bl.print_table(f"commit to handler start, {'durable' if durable else 'folded'}, "
                   f"{len(rows)} jobs one at a time (ms since the commit returned)",
                   ["stamp", "p50", "p99"],
                   [[s, f"{bl.pct([r[s] for r in rows], 50):.2f}",
                     f"{bl.pct([r[s] for r in rows], 99):.2f}"] for s in present])


if __name__ == "__main__":
    sys.exit(main())
