"""Pickup latency through the supervisor of a job the Node client admits, beside one the
Python client admits, on the same idle queue and supervisor: handler start − admit time.

    (cd clients/node && npm ci && npm run build) && (cd bench/node && npm ci)
    .venv/bin/python bench/node_pickup.py --runs 3

Per run: one private server, one supervisor (``handlers:record``), a warm-up, then
``--jobs`` probes from Python (``Queue.add``) and ``--jobs`` from Node
(``bench/node/pickup_add.mjs``), ``--gap-ms`` apart, the order alternating between runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import benchlib as bl

import echomq

NODE_ADD = Path(__file__).parent / "node" / "pickup_add.mjs"


def probes(lang: str, url: str, name: str, jobs: int, gap_s: float) -> None:
    if lang == "node":
        subprocess.run(["node", str(NODE_ADD), url, name, str(jobs), str(gap_s * 1000)],
                       check=True, timeout=300)
        return
    q = echomq.Queue(name, redis_url=url)
    nxt = time.perf_counter()
    for _ in range(jobs):
        q.add("probe", {"t": time.time()})
        nxt += gap_s
        time.sleep(max(0.0, nxt - time.perf_counter()))
    q.close()


def one_run(run: int, jobs: int, gap_s: float) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("nodepickup")
        proc = bl.start_supervisor(server.url, name, "handlers:record", 1)
        try:
            echomq.Queue(name, redis_url=server.url).add("warmup", {"t": time.time()})
            bl.collect_latencies(r, 1, 30, proc)
            for lang in (("python", "node") if run % 2 == 0 else ("node", "python")):
                time.sleep(1.0)  # let the consumer park again
                r.delete(bl.LAT_KEY)
                probes(lang, server.url, name, jobs, gap_s)
                lat = bl.collect_latencies(r, jobs, 30, proc)
                out[lang] = {"p50_ms": bl.pct(lat, 50) * 1000, "p99_ms": bl.pct(lat, 99) * 1000}
        finally:
            proc.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", metavar="FILE|-")
    args = ap.parse_args(argv)
    runs = [one_run(i, args.jobs, args.gap_ms / 1000) for i in range(args.runs)]
    rows, results = [], []
    for lang in ("python", "node"):
        s = {k: bl.summary([x[lang][k] for x in runs]) for k in ("p50_ms", "p99_ms")}
        results.append({"producer": lang, **s})
        rows.append([lang, bl.fmt_range(s["p50_ms"], "{:.2f}"),
                     bl.fmt_range(s["p99_ms"], "{:.2f}")])
    diffs = [x["node"]["p50_ms"] - x["python"]["p50_ms"] for x in runs]
    bl.print_table(f"Pickup through the supervisor, {args.jobs} jobs {args.gap_ms:g} ms apart, "
                   f"median (min–max) of {args.runs} run(s)",
                   ["producer", "p50 ms", "p99 ms"], rows)
    print(f"node p50 − python p50 per run: {', '.join(f'{d:+.2f} ms' for d in diffs)}",
          file=sys.stderr)
    bl.emit_json(args.json, {"bench": "node_pickup", "results": results, "p50_diff_ms": diffs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
