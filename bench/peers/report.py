"""Write docs/benchmarks.md and docs/benchmarks.png from a run.py results file.

    bench/.peers-venv/bin/python bench/peers/report.py bench/results/latest.json

Needs matplotlib for the chart (the peers virtualenv has it); without it the page is
still written. Hand-written analysis in ``bench/analysis.md`` is appended as is.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parent
DOC = REPO / "docs" / "benchmarks.md"
PNG = REPO / "docs" / "benchmarks.png"
ORDER = ["echomq", "rq", "arq", "saq", "celery", "dramatiq", "bullmq", "huey", "huey_thread",
         "streaq", "taskiq"]


def med(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)}


def fmt(s: dict[str, float] | None, spec: str = ",.0f") -> str:
    if s is None:
        return "—"
    m = format(s["median"], spec)
    if s["runs"] <= 1 or s["min"] == s["max"]:
        return m
    return f"{m} ({format(s['min'], spec)}–{format(s['max'], spec)})"


def ratio(s: dict[str, float] | None, base: dict[str, float] | None) -> str:
    if s is None or base is None or not base["median"]:
        return "—"
    r = s["median"] / base["median"]
    if r >= 100:
        return f"{r:,.0f}×"
    if r >= 10:
        return f"{r:.1f}×"
    return f"{r:.2f}×" if r >= 0.1 else f"{r:.3f}×"


def table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


class Peers:
    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        self.errors: dict[tuple[str, str], list[str]] = defaultdict(list)
        for r in results:
            key = (r["label"], r["system"])
            if "error" in r:
                self.errors[key].append(" / ".join(r["error"][-3:]))
            else:
                self.by[key].append(r)
        self.systems = [s for s in ORDER if any(k[1] == s for k in [*self.by, *self.errors])]

    def stat(self, label: str, system: str, metric: str) -> dict[str, float] | None:
        return med([r.get(metric) for r in self.by.get((label, system), [])])

    def runs(self, label: str, system: str) -> list[dict[str, Any]]:
        return self.by.get((label, system), [])

    def cell(self, label: str, system: str, metric: str, spec: str) -> str:
        s = self.stat(label, system, metric)
        if s is None and self.errors.get((label, system)):
            return "failed"
        text = fmt(s, spec)
        runs = self.runs(label, system)
        if runs and any(r.get("complete") is False for r in runs):
            done = statistics.median(r.get("done", 0) for r in runs)
            text += f" ¹ ({done:,.0f} done)"
        return text

    def cut_note(self, *labels: str) -> str:
        caps = {r.get("max_s") for label in labels for (lb, _), runs in self.by.items()
                if lb == label for r in runs if r.get("complete") is False}
        if not caps:
            return ""
        cap = max(c for c in caps if c is not None)
        return (f"¹ not drained within the {cap:g} s measuring window: the rate is over that "
                "window, from the first completed job (the rest of the queue was dropped).")

    def metric_table(self, label: str, cols: list[tuple[str, str, str]], note: str = "") -> str:
        """cols: (header, metric, format); each gets a '× EchoMQ' column."""
        headers = ["system"]
        for h, _, _ in cols:
            headers += [h, "× EchoMQ"]
        rows = []
        for s in self.systems:
            row = [s]
            for _, metric, spec in cols:
                row += [self.cell(label, s, metric, spec),
                        ratio(self.stat(label, s, metric), self.stat(label, "echomq", metric))]
            rows.append(row)
        best = [self.best_peer(label, metric) for _, metric, _ in cols]
        lines = [f"Best peer ({h}): **{b[0]}**, EchoMQ {self._versus(label, metric, b)}."
                 for (h, metric, _), b in zip(cols, best, strict=True) if b is not None]
        text = table(headers, rows)
        if lines:
            text += "\n\n" + " ".join(lines)
        return text + (f"\n\n{note}" if note else "")

    def best_peer(self, label: str, metric: str) -> tuple[str, float] | None:
        """The best measured peer (not EchoMQ) of one table, by median."""
        higher = metric.endswith("rate")
        found = [(s, st["median"]) for s in self.systems if s != "echomq"
                 if (st := self.stat(label, s, metric)) is not None]
        if not found:
            return None
        return (max if higher else min)(found, key=lambda item: item[1])

    def _versus(self, label: str, metric: str, best: tuple[str, float]) -> str:
        own = self.stat(label, "echomq", metric)
        if own is None:
            return "not measured"
        mine, theirs = own["median"], best[1]
        if not mine or not theirs:  # a ratio to zero says nothing: give both figures
            return f"{mine:.2f} against its {theirs:.2f}"
        if metric.endswith("rate"):
            return f"{mine / theirs:.1f}× its rate"
        if theirs >= mine:
            return f"{theirs / mine:.1f}× lower"
        return f"{mine / theirs:.1f}× higher"


# --- EchoMQ's own benchmarks ------------------------------------------------------------------

def _bell(result: dict[str, Any]) -> str:
    """The doorbell a result was measured with (``list`` before the kinds were compared)."""
    return str(result.get("doorbell", "list"))


def own_section(own: dict[str, Any]) -> str:
    parts = []

    def s(x: dict[str, float], spec: str = ",.0f") -> str:
        return fmt(x, spec)

    for key, title in (("drain", "20,000 queued"), ("drain_lanes", "over 10,000 lanes"),
                       ("drain_scale", "scale"), ("drain_1m", "one million queued, once")):
        d = own.get(key)
        if not d:
            continue
        if "error" in d:
            parts.append(f"**Drain, {title}**: failed: `{d['error'][-300:]}`")
            continue
        res = d["results"]
        jobs, lanes = res[0]["jobs"], res[0]["lanes"]
        runs = res[0]["rate"]["runs"]
        rows = [[x["mode"], str(x["processes"]), s(x["rate"]), s(x["boot_s"], ".2f"),
                 s(x["wall_s"], ".1f"), s(x["admit_rate"])] for x in res]
        parts.append(f"**Drain: {jobs:,} no-op jobs queued over {lanes:,} lane(s)** "
                     f"(median (min–max) of {runs} run(s)); `bench/drain.py`\n\n" + table(
                         ["consumer", "processes", "jobs/s", "boot s", "wall s",
                          "admit jobs/s (add_many)"], rows))
    d = own.get("pickup")
    if d and "results" in d:
        rows = [[x["mode"], str(x["processes"]), _bell(x), s(x["p50_ms"], ".2f"),
                 s(x["p99_ms"], ".2f"), s(x["max_ms"], ".2f")] for x in d["results"]]
        parts.append("**Pickup latency on an idle queue** (handler start − admit; 200 jobs "
                     "20 ms apart); `bench/pickup.py`\n\n" +
                     table(["consumer", "processes", "doorbell", "p50 ms", "p99 ms", "max ms"],
                           rows))
    d = own.get("idle")
    if d and "results" in d:
        rows = [[x["mode"], str(x["processes"]), _bell(x), s(x["per_s"], ".2f"),
                 ", ".join(f"{k} {v:g}" for k, v in x["by_command"].items())]
                for x in d["results"]]
        parts.append("**Idle cost**: Redis commands/s, beat 1000 ms (INFO commandstats, "
                     "commands inside scripts included); `bench/idle.py`\n\n" +
                     table(["consumer", "processes", "doorbell", "commands/s",
                            "per command (/s)"], rows))
    d = own.get("delayed")
    if d and "results" in d:
        rows = [[x["mode"], str(x["processes"]), _bell(x), s(x["p50_ms"], ".2f"),
                 s(x["p99_ms"], ".2f"), s(x["max_ms"], ".2f"), s(x["min_ms"], ".2f")]
                for x in d["results"]]
        parts.append("**Delayed-job lateness** (handler start − due; 200 jobs due in "
                     "0.3–3 s); `bench/delayed.py`\n\n" +
                     table(["consumer", "processes", "doorbell", "p50 ms", "p99 ms", "max ms",
                            "min ms"], rows))
    for key in ("memory", "memory_1m"):
        d = own.get(key)
        if not d or "error" in d:
            continue
        sups = d.get("supervisor") or []
        if key == "memory_1m" and (own.get("memory") or {}).get("supervisor"):
            sups = []  # the supervisor part is shown once, from "memory"
        if sups:
            rows = []
            for sup in sups:
                for phase in ("idle", "after"):
                    m = sup[phase]
                    rows.append([str(sup["processes"]),
                                 "idle" if phase == "idle" else f"after {sup['jobs']:,} jobs",
                                 f"{m['parent_rss_mb']:.1f}", f"{m['children_rss_mb']:.1f}",
                                 f"{m['parent_uss_mb']:.1f}", f"{m['children_uss_mb']:.1f}",
                                 f"{m['total_uss_mb']:.1f}"])
            parts.append("**Supervisor memory** (MiB; RSS counts pages shared after fork in "
                         "every process, USS only what each process alone holds); "
                         "`bench/memory.py`\n\n" +
                         table(["processes", "when", "parent RSS", "children RSS (sum)",
                                "parent USS", "children USS (sum)", "total USS"], rows))
        dm = d.get("delayed")
        if dm:
            parts.append(f"**Server memory for {dm['jobs']:,} delayed jobs**: used_memory "
                         f"+{dm['delta_mb']:.0f} MiB ({dm['bytes_per_job']:.0f} bytes/job), "
                         f"admitted at {dm['admit_rate']:,.0f} jobs/s with `add_many` "
                         f"({dm['admit_s']:.1f} s); used_memory_rss "
                         f"{dm['used_memory_rss_mb']:.0f} MiB.")
    return "\n\n".join(parts)


# --- chart ----------------------------------------------------------------------------------

def chart(peers: Peers) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    systems = peers.systems
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    x = range(len(systems))
    w = 0.38
    for i, (label, color) in enumerate((("drain×1", "#4878a8"), ("drain×2", "#9ab8d8"))):
        vals = [(peers.stat(label, s, "rate") or {"median": 0})["median"] for s in systems]
        ax1.bar([p + (i - 0.5) * w for p in x], vals, w, label=label.replace("drain", "")
                + " process" + ("es" if label.endswith("2") else ""), color=color)
    ax1.set_yscale("log")
    ax1.set_xticks(list(x), systems, rotation=20)
    ax1.set_ylabel("jobs/s (log)")
    ax1.set_title("No-op drain throughput, 20,000 queued")
    ax1.legend()
    for i, (metric, color) in enumerate((("p50_ms", "#d08040"), ("p99_ms", "#f0c090"))):
        vals = [(peers.stat("pickup", s, metric) or {"median": 0})["median"] for s in systems]
        ax2.bar([p + (i - 0.5) * w for p in x], vals, w, label=metric.replace("_ms", ""),
                color=color)
    ax2.set_yscale("log")
    ax2.set_xticks(list(x), systems, rotation=20)
    ax2.set_ylabel("ms (log)")
    ax2.set_title("Pickup latency on an idle queue (1 worker process)")
    ax2.legend()
    fig.tight_layout()
    PNG.parent.mkdir(exist_ok=True)
    fig.savefig(PNG, dpi=110)
    return True


# --- the page -----------------------------------------------------------------------------------

def main(path: str) -> int:
    data = json.loads(Path(path).read_text())
    m = data["machine"]
    peers = Peers(data.get("peers", []))
    runs = data.get("runs", 3)
    sj = data.get("scale_jobs", 200_000)
    out: list[str] = ["# Benchmarks", ""]
    out.append(
        "EchoMQ's own benchmarks and a comparison with RQ, arq, SAQ, Celery, Dramatiq, "
        "BullMQ (Python), huey (process and thread workers), streaq and taskiq on one "
        "private server. Generated by `bench/peers/run.py` "
        f"({'quick smoke run: small sizes, ' if data.get('quick') else ''}"
        f"total {data.get('total_s', 0) / 60:.0f} min) from "
        f"`bench/results/{Path(path).name}`; see `bench/README.md` for the commands.")
    out += ["", "## Machine", "",
            f"- {m['nproc']} cores ({m['cpu']}), shared with other work while this ran; "
            f"{m['uname']}",
            f"- Python {m['python']}; server: `{m['server']}` (private, no persistence)",
            f"- date: {m['date']}" + (f"; EchoMQ at commit `{m['commit']}`"
                                      if m.get("commit") else ""),
            "", "```", m["free_h"], "```", ""]
    if data.get("versions"):
        rows = [[s, ", ".join(f"{k} {v}" for k, v in data["versions"][s].items()),
                 data.get("config", {}).get(s, "")] for s in ORDER if s in data["versions"]]
        out += ["Packages and how each system was run (each as its docs show; no-op handler; "
                "JSON payloads):", "", table(["system", "versions", "workers and API"], rows),
                ""]
    if data.get("failed"):
        out += ["**Could not be installed or run here:**", ""]
        for s, err in data["failed"].items():
            out += [f"- {s}:", "", "```", err[-1500:], "```"]
        out.append("")
    raw = data.get("raw")
    if raw:
        out += ["## The server's raw limits", "",
                "`redis-benchmark -p PORT -q -n 100000 -t ping,lpush,lpop` and `evalsha` of "
                "`return 1`, then a redis-py loop of PINGs on one connection:", ""]
        rows = []
        for label, res in raw.items():
            if isinstance(res, dict):
                rows += [[label, k, f"{v:,.0f}"] for k, v in res.items()]
            else:
                rows.append([label, "PING", f"{res:,.0f}"])
        out += [table(["client", "command", "requests/s"], rows), ""]
    if data.get("own"):
        out += ["## EchoMQ's own benchmarks", "",
                "Each run starts its own server (the embedded Valkey; redis-server with "
                "`ECHOMQ_SERVER_BINARY=redis`); the consumers are "
                "`echomq-supervisor start --processes N` (handler `bench/handlers.py`) or one "
                "standalone `echomq.Consumer(...).run()` process. Drain clocks start at the "
                "first completed job (boot time is shown apart) and stop when "
                "`counts()[\"completed\"]` reaches the total.", "",
                own_section(data["own"]), ""]
    if peers.systems:
        scaled = any(peers.runs(label, s) for s in peers.systems
                     for label in ("scale drain", "scale delayed memory"))
        out += ["## EchoMQ and its peers", "",
                f"Same driver (`bench/peers/driver.py`) and same server for every system; "
                f"median (min–max) of {runs} run(s) unless marked; "
                + (f"the scale items ran once each with {sj:,} jobs, not 1,000,000: filling a "
                   "million one by one takes the slower peers several minutes each, which would "
                   "put the suite far past 25 minutes (EchoMQ's own million-job figures are "
                   "above). " if scaled else "the scale items were not part of this run. ")
                + "Completion is counted "
                "the same way for all: the no-op handler appends one byte to a file whose "
                "size the driver polls every 5 ms. **× EchoMQ** is the system's figure "
                "divided by EchoMQ's (above 1 means more: better for throughput, worse for "
                "latency, commands and memory).", "",
                (HERE / "settings.md").read_text().rstrip("\n"), ""]
        if chart(peers):
            out += ["![throughput and pickup latency per system](benchmarks.png)", ""]
        cpu = ("CPU µs/job (workers + server)", "cpu_us", ",.0f")
        out += ["### 1. Drain throughput (no-op jobs, 200,000 queued, then workers start)", "",
                "Each rate sits beside the CPU time the workers and the server spent per job "
                "over the same window (from `/proc` and the server's `INFO cpu`): steadier "
                "than a rate on a shared machine, lower is better.", "",
                peers.metric_table("drain×1", [("1 process jobs/s", "rate", ",.0f"), cpu]), "",
                peers.metric_table("drain×2", [("2 processes jobs/s", "rate", ",.0f"), cpu],
                                   peers.cut_note("drain×1", "drain×2")), "",
                "### 1b. Drains that look like real jobs", "",
                peers.metric_table("1 KiB×1", [("1 KiB payload, 200 B result kept, 1 process "
                                                 "jobs/s", "rate", ",.0f"), cpu]), "",
                peers.metric_table("cpu×1", [("~100 µs CPU per job, 1 process jobs/s", "rate",
                                               ",.0f"), cpu]), "",
                peers.metric_table("io×2 (200)", [("50 ms I/O, 2 processes × 100 in flight "
                                                   "jobs/s (ideal 4,000)", "rate", ",.0f")]), "",
                peers.metric_table("io×2 (2000)", [("50 ms I/O, 2 processes × 1,000 in flight "
                                                    "jobs/s", "rate", ",.0f")],
                                   peers.cut_note("1 KiB×1", "cpu×1", "io×2 (200)",
                                                  "io×2 (2000)")), "",
                "### 2. Enqueue throughput (no workers)", "",
                peers.metric_table("enqueue", [("one by one jobs/s", "one_rate", ",.0f"),
                                               ("bulk jobs/s", "bulk_rate", ",.0f")],
                                   "Bulk: EchoMQ `add_many`, RQ `enqueue_many`, BullMQ "
                                   "`addBulk`; the others have no bulk API (—)."), "",
                "### 3. Pickup latency on an idle queue (1 worker process, 200 jobs 20 ms "
                "apart)", "",
                peers.metric_table("pickup", [("p50 ms", "p50_ms", ".2f"),
                                              ("p99 ms", "p99_ms", ".2f")]), "",
                "### 4. Idle cost: Redis commands/s (INFO commandstats)", "",
                peers.metric_table("idle×1", [("1 worker cmd/s", "per_s", ".2f")]), "",
                peers.metric_table("idle×4", [("4 workers cmd/s", "per_s", ".2f")]), "",
                _idle_breakdown(peers), "",
                "### 5. Delayed jobs: lateness (start − due) for 200 jobs due in 0.3–3 s", "",
                peers.metric_table("delayed", [("p50 ms", "p50_ms", ".1f"),
                                               ("p99 ms", "p99_ms", ".1f")]), ""]
        if scaled:
            out += [f"### 6. Scale ({sj:,} jobs, one run each)", "",
                peers.metric_table("scale drain", [(f"drain jobs/s, {sj:,} queued", "rate",
                                                    ",.0f")],
                                   peers.cut_note("scale drain")), "",
                peers.metric_table("scale delayed memory",
                                   [("admit delayed jobs/s", "admit_rate", ",.0f"),
                                    ("used_memory bytes/job", "bytes_per_job", ",.0f")],
                                   "Delayed jobs due in 1–61 minutes, admitted with the "
                                   "fastest API each offers (bulk where there is one, "
                                   "asyncio.gather of 500 for arq and SAQ, a pipeline of 1,000 "
                                   "`enqueue_in` for RQ, one by one for Celery and Dramatiq)."),
                ""]
        errs = [(k, v) for k, v in peers.errors.items() if v]
        if errs:
            out += ["### Runs that failed", ""]
            for (label, s), msgs in errs:
                out.append(f"- {s} / {label}: `{msgs[-1][-400:]}`")
            out.append("")
    notes = BENCH / "analysis.md"
    if notes.exists():
        out += [notes.read_text().strip(), ""]
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text("\n".join(out).rstrip() + "\n")
    print(f"wrote {DOC}" + (f" and {PNG}" if PNG.exists() else ""))
    return 0


def _idle_breakdown(peers: Peers) -> str:
    rows = []
    for s in peers.systems:
        for label in ("idle×1", "idle×4"):
            runs = peers.runs(label, s)
            if runs:
                mid = sorted(runs, key=lambda r: r["per_s"])[len(runs) // 2]
                rows.append([s, label[-2:], ", ".join(f"{k} {v:g}" for k, v in
                                                       mid["by_command"].items()) or "(none)"])
    return "Per command (median run, calls/s):\n\n" + table(["system", "workers", "commands"],
                                                            rows)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else str(BENCH / "results" /
                                                                     "latest.json")))
