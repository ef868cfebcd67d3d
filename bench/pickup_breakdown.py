"""Where a pickup's time goes, hop by hop, through the supervisor on an idle queue.

    .venv/bin/python bench/pickup_breakdown.py               # 200 jobs, 20 ms apart
    .venv/bin/python bench/pickup_breakdown.py --doorbell marker --json -

The supervisor runs in a launcher process (this file with ``--serve``) that wraps a
few of its methods with clock readings before it starts, so the forked consumers
carry them too: the metronome reading the doorbell's reply, the parent writing the
poke, the consumer waking to drain, its claim's round trip, and the handler's first
line. Each job carries ``time.time()`` taken just before its ``Queue.add``. The
stages of one pickup are matched by time (one job in flight at a time), and each
is given as p50/p90 over the jobs:

    admit → ring read     producer's add, the admit script, the server's wake-up of
                          the parked BLPOP and the supervisor's wake-up
    reading the ring      the reply parsed (collect_ring)
    ring → poke           the arbiter's decision and the write to the child's pipe
    poke → consumer       the consumer's wake-up on its pipe
    consumer → claim      from waking to the claim's request
    claim round trip      the claim script and its reply, parsed
    claim → handler       from the claimed batch to the handler's first line

The wrappers add a clock reading or two per stage (well under a microsecond each);
the traces are written after each drain and at exit, off the measured path.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib as bl
import redis

STAGES = ("admit → ring read", "reading the ring", "ring → poke", "poke → consumer",
          "consumer → claim", "claim round trip", "claim → handler", "total")


_client: redis.Redis | None = None


def record(job: Any) -> None:
    """The handler: its start time beside the job's admit time."""
    global _client
    started = time.time()
    if _client is None:  # made in the consumer, after the fork
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    _client.rpush("bench:pickup", f"{job.payload['t']:.6f} {started:.6f}")


def serve(argv: list[str], trace_dir: Path) -> int:
    """Run ``echomq-supervisor`` with the clock readings wrapped around its methods."""
    from echomq.supervisor import cli, protocol
    from echomq.supervisor.children import Child
    from echomq.supervisor.metronome import Metronome
    from echomq.supervisor.worker import Worker

    from echomq.lanes import Lanes

    parent: list[tuple[str, float]] = []
    child: list[tuple[str, float]] = []

    collect_ring, send = Metronome.collect_ring, Child.send
    drain_safely, claim = Worker._drain_safely, Lanes.claim

    def timed_collect(self: Metronome) -> bool:
        t0 = time.time()
        rung = collect_ring(self)
        if rung:
            parent.extend([("ring0", t0), ("ring1", time.time())])
        return rung

    def timed_send(self: Child, message: bytes) -> bool:
        if message == protocol.POKE:
            parent.append(("poke", time.time()))
        return send(self, message)

    def timed_drain(self: Worker) -> None:
        child.append(("wake", time.time()))
        try:
            drain_safely(self)
        finally:
            with (trace_dir / f"child-{os.getpid()}.jsonl").open("a") as f:
                f.write(json.dumps(child) + "\n")
            child.clear()

    def timed_claim(self: Lanes, count: int = 1, *, chain: bool = False) -> Any:
        child.append(("claim0", time.time()))
        out = claim(self, count, chain=chain)
        child.append(("claim1", time.time()))
        return out

    Metronome.collect_ring = timed_collect  # type: ignore[method-assign]
    Child.send = timed_send  # type: ignore[method-assign]
    Worker._drain_safely = timed_drain  # type: ignore[method-assign]
    Lanes.claim = timed_claim  # type: ignore[method-assign]
    pid = os.getpid()
    atexit.register(lambda: os.getpid() == pid and (trace_dir / "parent.json").write_text(
        json.dumps(parent)))
    return cli.main(argv)


def _after(times: list[float], t: float) -> float:
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else float("nan")


def stages(trace_dir: Path, jobs: list[tuple[float, float]]) -> dict[str, list[float]]:
    """Per stage, its duration for each job (ms), matched by time."""
    events: dict[str, list[float]] = {}
    parent = json.loads((trace_dir / "parent.json").read_text())
    for name, t in parent:
        events.setdefault(name, []).append(t)
    for path in trace_dir.glob("child-*.jsonl"):
        for line in path.read_text().splitlines():
            for name, t in json.loads(line):
                events.setdefault(name, []).append(t)
    for times in events.values():
        times.sort()
    out: dict[str, list[float]] = {s: [] for s in STAGES}
    for admitted, started in jobs:
        r0 = _after(events["ring0"], admitted)
        r1 = _after(events["ring1"], r0)
        poke = _after(events["poke"], r1)
        wake = _after(events["wake"], poke)
        c0 = _after(events["claim0"], wake)
        c1 = _after(events["claim1"], c0)
        points = [admitted, r0, r1, poke, wake, c0, c1, started]
        for name, a, b in zip(STAGES[:-1], points[:-1], points[1:], strict=True):
            out[name].append((b - a) * 1000)
        out["total"].append((started - admitted) * 1000)
    return out


def one_run(jobs: int, gap_s: float, doorbell: str) -> dict[str, dict[str, float]]:
    import echomq

    with bl.private_redis() as server, tempfile.TemporaryDirectory() as tmp:
        trace_dir = Path(tmp)
        r = bl.client(server.url)
        name = bl.unique_queue("pickup-breakdown")
        q = echomq.Queue(name, redis_url=server.url)
        argv = bl.supervisor_argv(server.url, name, "pickup_breakdown:record", 1,
                                  extra=["--doorbell", doorbell])
        start = argv.index("start")
        proc = bl.Proc([sys.executable, __file__, "--serve", str(trace_dir), "--",
                        *argv[start:]], env={"BENCH_REDIS_URL": server.url},
                       tag="supervisor")
        try:
            q.add("warmup", {"t": time.time()})
            bl.wait_until(lambda: r.llen("bench:pickup") >= 1, 30, what="warm-up", proc=proc)
            time.sleep(1.5)  # let the consumer park again
            r.delete("bench:pickup")
            nxt = time.perf_counter()
            for _ in range(jobs):
                q.add("probe", {"t": time.time()})
                nxt += gap_s
                time.sleep(max(0.0, nxt - time.perf_counter()))
            bl.wait_until(lambda: r.llen("bench:pickup") >= jobs, 30, what="pickups",
                          proc=proc)
            pairs = [tuple(map(float, x.split())) for x in r.lrange("bench:pickup", 0, -1)]
        finally:
            proc.stop()
            q.close()
        per_stage = stages(trace_dir, pairs)  # type: ignore[arg-type]
    return {s: {"p50": bl.pct(v, 50), "p90": bl.pct(v, 90)} for s, v in per_stage.items()}


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--serve"]:
        return serve(args_in[3:], Path(args_in[1]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--doorbell", default="list", choices=["list", "marker"])
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(args_in)
    result = one_run(args.jobs, args.gap_ms / 1000, args.doorbell)
    rows = [[s, f"{v['p50']:.3f}", f"{v['p90']:.3f}"] for s, v in result.items()]
    bl.print_table(f"EchoMQ pickup, hop by hop: supervisor ×1, {args.doorbell} doorbell, "
                   f"{args.jobs} jobs {args.gap_ms:g} ms apart (ms)", ["stage", "p50", "p90"],
                   rows)
    bl.emit_json(args.json, {"doorbell": args.doorbell, "jobs": args.jobs, "stages": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
