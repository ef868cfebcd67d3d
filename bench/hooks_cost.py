"""What middleware, the event stream and Sentry's middleware cost the no-op drain.

    .venv/bin/python bench/hooks_cost.py                  # 20,000 jobs, 5 rounds
    .venv/bin/python bench/hooks_cost.py --jobs 50000 --rounds 7 --json -

One private server, one process: each round admits ``--jobs`` no-op jobs per setting
and drains them with an in-process standalone consumer claiming batches (as
bench/regression.py does), the settings interleaved and their order rotated from
round to round, so drift in the machine's load falls on all of them.

Settings:

- **bare**: no middleware, events off (``q.set_events(False)``)
- **events**: no middleware, events on (the default: ``started`` and ``completed``
  appended per job by claim.lua and settle.lua)
- **middleware**: one no-op middleware (``before_job`` and ``after_job`` defined,
  doing nothing), events off
- **sentry**: ``SentryMiddleware()`` with a Sentry client whose transport drops
  everything (no job fails, so it captures nothing), events off

Reported per setting: CPU µs per job (this process plus the server, from ``INFO cpu``:
steadier than wall time on a shared machine), its cost against **bare** on the
medians and as the median of each round's ratio (the settings of one round run back
to back, so the ratio cancels most of the drift of the machine's load), the server's
time in scripts per job (``INFO commandstats``, the part the event stream adds to)
and the share of it spent in XADD (measured in the same calls, so the machine's load
cancels out of it), and jobs per wall second.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import benchlib as bl
from standalone_claims import Batched

import echomq


class Noop(echomq.Middleware):
    def before_job(self, job: echomq.Job) -> None:
        pass

    def after_job(self, job: echomq.Job, result: Any) -> None:
        pass


def _sentry() -> list[Any]:
    import sentry_sdk
    from sentry_sdk.transport import Transport

    from echomq.contrib.sentry import SentryMiddleware

    class Drop(Transport):  # type: ignore[misc]
        def capture_envelope(self, envelope: Any) -> None:
            pass

    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=Drop,
                    default_integrations=False)
    return [SentryMiddleware()]


SETTINGS: dict[str, tuple[bool, Callable[[], list[Any]]]] = {
    "bare": (False, list),
    "events": (True, list),
    "middleware": (False, lambda: [Noop()]),
    "sentry": (False, _sentry),
}


def cpu_seconds(r: Any) -> float:
    info = r.info("cpu")
    return time.process_time() + float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def script_us(r: Any) -> tuple[float, float]:
    """Microseconds the server spent running scripts so far, and running XADD inside them
    (INFO commandstats)."""
    stats = r.info("commandstats")
    return (float(sum(int(stats.get(c, {}).get("usec", 0))
                      for c in ("cmdstat_evalsha", "cmdstat_eval"))),
            float(stats.get("cmdstat_xadd", {}).get("usec", 0)))


def drain(url: str, r: Any, events: bool, middleware: list[Any], jobs: int
          ) -> tuple[float, float, float, float]:
    """(CPU µs per job, script µs per job on the server, of which XADD, jobs per wall
    second) of one burst drain."""
    q = echomq.Queue(bl.unique_queue("hooks"), redis_url=url)
    q.set_events(events)
    bl.admit_noop(q, jobs)
    consumer = Batched(q, lambda job: None, middleware=middleware)
    cpu, wall, lua = cpu_seconds(r), time.perf_counter(), script_us(r)
    consumer.run(burst=True)
    wall, cpu = time.perf_counter() - wall, cpu_seconds(r) - cpu
    lua_end = script_us(r)
    lua, xadd = lua_end[0] - lua[0], lua_end[1] - lua[1]
    done = q.counts()["completed"]
    q.close()
    if done != jobs:
        raise SystemExit(f"the drain completed {done} of {jobs} jobs")
    return cpu / jobs * 1e6, lua / jobs, xadd / jobs, jobs / wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    names = list(SETTINGS)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    rate: dict[str, list[float]] = {n: [] for n in names}
    lua: dict[str, list[float]] = {n: [] for n in names}
    xadd: dict[str, list[float]] = {n: [] for n in names}
    built = {n: SETTINGS[n][1]() for n in names}  # Sentry's client set up once
    with bl.private_redis() as server:
        r = bl.client(server.url)
        drain(server.url, r, True, [], 2_000)  # warm-up: scripts loaded, imports settled
        for i in range(args.rounds):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                us, script, xadds, jobs_s = drain(server.url, r, SETTINGS[name][0],
                                                  built[name], args.jobs)
                cpu[name].append(us)
                lua[name].append(script)
                xadd[name].append(xadds)
                rate[name].append(jobs_s)
            r.flushall()
    base = statistics.median(cpu["bare"])
    rows = []
    for name in names:
        med = statistics.median(cpu[name])
        paired = statistics.median(c / b for c, b in zip(cpu[name], cpu["bare"], strict=True))
        rows.append([name, bl.fmt_range(bl.summary(cpu[name]), "{:.1f}"),
                     f"{(med / base - 1) * 100:+.1f} %", f"{(paired - 1) * 100:+.1f} %",
                     bl.fmt_range(bl.summary(lua[name]), "{:.2f}"),
                     f"{statistics.median(xadd[name]) / statistics.median(lua[name]) * 100:.1f} %",
                     bl.fmt_range(bl.summary(rate[name]))])
    bl.print_table(f"No-op drain, {args.jobs:,} jobs, 1 process: median (min–max) of "
                   f"{args.rounds} interleaved rounds",
                   ["setting", "CPU µs/job", "vs bare (medians)", "vs bare (per round)",
                    "script µs/job (server)",
                    "XADD share", "jobs/s"], rows)
    if args.json:
        bl.emit_json(args.json, {"jobs": args.jobs, "rounds": args.rounds,
                                 "cpu_us_per_job": cpu, "script_us_per_job": lua,
                                 "xadd_us_per_job": xadd,
                                 "jobs_per_s": rate})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
