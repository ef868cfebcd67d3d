"""Operations at scale: CLI ``stats``/``jobs`` latency and dashboard render time on a queue
of 1,000,000 waiting jobs over 10,000 lanes, and the per-job cost of the consumers' metrics.

    .venv/bin/python bench/ops.py                          # 1,000,000 jobs, 10,000 lanes
    .venv/bin/python bench/ops.py --jobs 200000 --lanes 2000 --runs 5 --json -

On a fresh private server: ``--jobs`` waiting jobs admitted over ``--lanes`` lanes
(``add_many``), plus 1,000 dead jobs and 1,000 scheduled ones. Then, each ``--runs``
times: the calls the CLI makes, timed in-process (the server's share); the ``echomq``
command itself as a subprocess (wall time, Python start-up included); the dashboard page
rendered in-process and fetched over HTTP. Last, the cost of the observations a consumer
folds for /metrics: per job in the runner (a no-op handler, with and without the timing
wrapper), and on the no-op drain (``--drain-jobs`` jobs drained in this process, runs
with and without the wrapper alternating).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchlib as bl
from echomq.supervisor.drills.localredis import free_port
from echomq.supervisor.observations import Observations

import echomq
from echomq.config import QueueSettings
from echomq.job import Claimed
from echomq.lanes import Lanes, Outcome
from echomq.ops.dashboard import Dashboard, handler_class
from echomq.ops.views import summary
from echomq.runner import Runner

CLI = [str(Path(sys.executable).parent / "echomq")]


def timed(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    fn()  # warm: scripts loaded, connections open
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return bl.summary(samples)


def seed(q: echomq.Queue, jobs: int, lanes: int) -> float:
    rate = bl.admit_noop(q, jobs, lanes=lanes)
    dead = q.add_many([("doomed", {"i": i}, {"lane": "dead-lane"}) for i in range(1000)])
    lanes_api = Lanes(q.redis, q.keys, q.settings)
    # claim them by id order: pause the rest of the queue by draining only this lane's jobs
    q.redis.lrem(q.keys.ring, 0, "dead-lane")
    q.redis.lpush(q.keys.ring, "dead-lane")
    claimed = lanes_api.claim(1000)
    settle = [Outcome(c.id, c.token, "d", "ValueError: seeded failure") for c in claimed]
    lanes_api.settle(settle)
    q.add_many([("later", None, {"delay": 3600}) for _ in range(1000)])
    assert len(dead) == 1000
    return rate


def observation_cost(n: int = 200_000, rounds: int = 7) -> dict[str, float]:
    runner = Runner("q", lambda job: None, QueueSettings())
    wrapped = Runner("q", lambda job: None, QueueSettings(), observer=Observations().fold)
    claimed = Claimed("id", "t", "noop", "null", "default", 1, 3, "", int(time.time() * 1000))
    best = {"bare": float("inf"), "timed": float("inf")}
    for _ in range(rounds):
        for name, fn in (("bare", runner.run), ("timed", wrapped.run)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn(claimed)
            best[name] = min(best[name], (time.perf_counter() - t0) / n * 1e6)
    return {"bare_us": best["bare"], "timed_us": best["timed"],
            "added_us": best["timed"] - best["bare"]}


class _Hooks:
    """The drain's hooks with nothing to do (the standalone consumer's, less its parking)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def stop_requested(self) -> bool:
        return False

    def batch_size(self) -> int:
        return int(self.runner.batch_size())

    def on_batch(self, batch: Any) -> None: ...

    def on_start(self, claimed: Any) -> None: ...

    def on_unstarted(self, pairs: Any) -> None: ...

    def after_settle(self, outcomes: Any, codes: Any) -> None: ...


def drain_overhead(jobs: int, rounds: int) -> dict[str, Any]:
    """The no-op drain in this process, with and without the metrics wrapper, alternating."""
    from echomq.drain import Drain

    rates: dict[str, list[float]] = {"bare": [], "timed": []}
    with bl.private_redis() as server:
        r = bl.client(server.url)
        for _ in range(rounds):
            for mode in ("bare", "timed"):
                q = echomq.Queue(bl.unique_queue("ovh"), redis=r)
                bl.admit_noop(q, jobs)
                runner = Runner(q.name, lambda job: None, q.settings,
                                observer=Observations().fold if mode == "timed" else None)
                drain = Drain(Lanes(r, q.keys, q.settings), runner, _Hooks(runner))
                t0 = time.perf_counter()
                drain.run()
                rates[mode].append(jobs / (time.perf_counter() - t0))
                assert q.counts()["completed"] == jobs
    bare, timed = bl.summary(rates["bare"]), bl.summary(rates["timed"])
    # other load on the machine only ever slows a run down: the best runs compare the code
    return {"bare_jobs_s": bare, "timed_jobs_s": timed,
            "cost_pct": 100 * (1 - timed["median"] / bare["median"]),
            "cost_pct_best": 100 * (1 - timed["max"] / bare["max"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--lanes", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--drain-jobs", type=int, default=20_000)
    ap.add_argument("--drain-runs", type=int, default=9)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    rows: list[list[Any]] = []
    results: dict[str, Any] = {"jobs": args.jobs, "lanes": args.lanes}
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("ops")
        q = echomq.Queue(name, redis=r)
        t0 = time.perf_counter()
        rate = seed(q, args.jobs, args.lanes)
        print(f"  seeded {args.jobs:,} jobs over {args.lanes:,} lanes in "
              f"{time.perf_counter() - t0:.1f} s ({rate:,.0f} jobs/s)", file=sys.stderr)
        counts = q.counts()
        results["counts"] = counts
        inproc = {
            "stats (counts + lane survey)": lambda: summary(q, top_lanes=5),
            "counts()": q.counts,
            "jobs waiting, limit 100": lambda: q.jobs("waiting", 100),
            "jobs dead, limit 100": lambda: q.jobs("dead", 100),
            "jobs waiting, page 50 (cursor)": lambda: q.jobs_page("waiting", 100,
                                                                  cursor="49:0"),
        }
        for label, fn in inproc.items():
            s = timed(fn, args.runs)
            results[label] = s
            rows.append([label, "in-process", bl.fmt_range(s, "{:.1f}")])
        for label, cmd in (("echomq stats --json", ["stats", name, "--json"]),
                           ("echomq jobs --state waiting --limit 100 --json",
                            ["jobs", name, "--state", "waiting", "--limit", "100", "--json"])):
            argv_ = [*CLI, "--redis-url", server.url, *cmd]
            s = timed(lambda argv_=argv_: subprocess.run(argv_, check=True, capture_output=True),
                      args.runs)
            results[label] = s
            rows.append([label, "subprocess (wall)", bl.fmt_range(s, "{:.1f}")])
        import secrets

        dash = Dashboard(r, allow_actions=True, token=secrets.token_urlsafe(32))
        dash.history.sample()
        s = timed(lambda: dash.render(name, signed_in=True), args.runs)
        results["dashboard render"] = s
        rows.append(["dashboard page render", "in-process", bl.fmt_range(s, "{:.1f}")])
        from http.server import ThreadingHTTPServer

        port = free_port()
        httpd = ThreadingHTTPServer(("127.0.0.1", port), handler_class(dash))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{port}/?queue={name}"
        s = timed(lambda: urllib.request.urlopen(url, timeout=30).read(), args.runs)
        httpd.shutdown()
        results["dashboard GET"] = s
        rows.append(["dashboard GET / (HTTP)", "HTTP", bl.fmt_range(s, "{:.1f}")])
        q.close()
    cost = observation_cost()
    results["observation_cost"] = cost
    drain = drain_overhead(args.drain_jobs, args.drain_runs)
    results["drain_overhead"] = drain
    bl.print_table(
        f"EchoMQ operations on {args.jobs:,} waiting jobs over {args.lanes:,} lanes "
        f"(+1,000 dead, +1,000 scheduled): ms, median (min–max) of {args.runs} runs",
        ["what", "how", "ms"], rows)
    print(f"\nmetrics in the consumer: {cost['added_us']:.2f} µs per job added to a no-op "
          f"job's {cost['bare_us']:.2f} µs in the runner (best of 7 × 200,000); compare with "
          "the per-job time of bench/drain.py")
    print(f"no-op drain of {args.drain_jobs:,} jobs in one process, alternating, "
          f"{args.drain_runs} "
          f"runs each: {bl.fmt_range(drain['bare_jobs_s'])} jobs/s without the metrics wrapper, "
          f"{bl.fmt_range(drain['timed_jobs_s'])} with it: {drain['cost_pct']:+.1f}% "
          f"(medians), {drain['cost_pct_best']:+.1f}% (best runs)")
    bl.emit_json(args.json, {"bench": "ops", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
