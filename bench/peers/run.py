"""The whole comparison in one command: EchoMQ and its peers on one private redis-server.

    .venv/bin/python bench/peers/run.py                 # install, run everything, write docs
    .venv/bin/python bench/peers/run.py --quick         # small sizes, one run: a smoke test
    .venv/bin/python bench/peers/run.py --systems echomq,rq --workloads drain,pickup

1. Virtualenvs: ``bench/.peers-venv`` gets RQ, SAQ, Celery[redis], Dramatiq[redis], huey
   (and gevent), streaq, taskiq-redis and the ``bullmq`` package (plus matplotlib for the
   chart); arq pins ``redis<6`` while Celery/kombu and bullmq need ``redis>=6.4``, so arq
   gets its own, nested at ``bench/.peers-venv/arq``. A package that cannot be installed
   is reported, not fatal. EchoMQ runs from the repository's ``.venv``.
2. One private redis-server (``LocalRedis``), never the shared one; its raw limits
   (``redis-benchmark``) and a redis-py PING loop.
3. For each run, each system, each workload: ``driver.py`` in that system's virtualenv,
   in its own process group, bounded by a timeout; leftover workers are killed.
4. EchoMQ's own benchmarks (``bench/*.py --json``), unless ``--skip-own``.
5. Raw results to ``bench/results/``; ``report.py`` writes ``docs/benchmarks.md`` and
   ``docs/benchmarks.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import benchlib as bl  # noqa: E402
import psutil  # noqa: E402

PEERS_VENV = BENCH / ".peers-venv"
ARQ_VENV = PEERS_VENV / "arq"
RESULTS = BENCH / "results"
MAIN_PY = REPO / ".venv" / "bin" / "python"

PEER_PACKAGES = {  # system -> pip requirement, in the shared peers venv
    "rq": "rq",
    "saq": "saq[redis,hiredis]",
    "celery": "celery[redis]",
    "dramatiq": "dramatiq[redis]",
    "bullmq": "bullmq",
    "huey": "huey",
    "huey_thread": "huey",
    "streaq": "streaq",
    "taskiq": "taskiq-redis>=1.2.4",  # 1.2.2 imports a name taskiq 0.13 no longer has
}
COMMON_PACKAGES = ["psutil", "hiredis", "matplotlib", "gevent"]  # gevent: huey's greenlets
ARQ_PACKAGES = ["arq", "psutil", "hiredis"]
SYSTEMS = ["echomq", "rq", "arq", "saq", "celery", "dramatiq", "bullmq", "huey", "huey_thread",
           "streaq", "taskiq"]
VERSION_NAMES = {"echomq": ["echomq", "redis", "hiredis"], "rq": ["rq", "redis"],
                 "arq": ["arq", "redis"], "saq": ["saq", "redis"],
                 "celery": ["celery", "kombu", "redis"], "dramatiq": ["dramatiq", "redis"],
                 "bullmq": ["bullmq", "redis"], "huey": ["huey", "redis", "gevent"],
                 "huey_thread": ["huey", "redis"], "streaq": ["streaq", "coredis"],
                 "taskiq": ["taskiq", "taskiq-redis", "redis"]}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- virtualenvs ------------------------------------------------------------------------

def _pip(venv: Path, packages: list[str]) -> tuple[bool, str]:
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           *packages], capture_output=True, text=True, timeout=1800)
    out = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines()
                    if not line.startswith("WARNING: Location"))
    return proc.returncode == 0, out.strip()


def _make_venv(venv: Path) -> None:
    if not (venv / "bin" / "python").exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)


def ensure_venvs(systems: list[str], skip_install: bool) -> dict[str, str]:
    """Install what the chosen systems need; returns {system: error} for those that failed."""
    failed: dict[str, str] = {}
    wanted = [s for s in systems if s in PEER_PACKAGES]
    if wanted or "arq" in systems:
        _make_venv(PEERS_VENV)
    if wanted and not skip_install:
        log(f"installing into {PEERS_VENV}: {', '.join(PEER_PACKAGES[s] for s in wanted)}")
        ok, out = _pip(PEERS_VENV, [PEER_PACKAGES[s] for s in wanted] + COMMON_PACKAGES)
        if not ok:  # find out which one: install them one at a time
            log("a combined install failed; installing one by one")
            _pip(PEERS_VENV, COMMON_PACKAGES)
            for s in wanted:
                ok1, out1 = _pip(PEERS_VENV, [PEER_PACKAGES[s]])
                if not ok1:
                    failed[s] = out1[-2000:]
    if "arq" in systems:
        _make_venv(ARQ_VENV)
        if not skip_install:
            log(f"installing into {ARQ_VENV}: arq")
            ok, out = _pip(ARQ_VENV, ARQ_PACKAGES)
            if not ok:
                failed["arq"] = out[-2000:]
    return failed


def python_for(system: str) -> Path:
    if system == "echomq":
        return MAIN_PY if MAIN_PY.exists() else Path(sys.executable)
    if system == "arq":
        return ARQ_VENV / "bin" / "python"
    return PEERS_VENV / "bin" / "python"


def versions(system: str) -> dict[str, str]:
    code = ("import json, importlib.metadata as m\nout = {}\n"
            f"for n in {VERSION_NAMES[system]!r}:\n"
            "    try: out[n] = m.version(n)\n"
            "    except Exception: out[n] = None\nprint(json.dumps(out))")
    try:
        out = subprocess.run([str(python_for(system)), "-c", code], capture_output=True,
                             text=True, timeout=60).stdout
        return json.loads(out)
    except Exception as exc:
        return {"error": str(exc)}


# --- the machine and the server's raw limits ------------------------------------------------

def machine() -> dict[str, Any]:
    def sh(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as exc:
            return f"({exc})"
    from echomq.supervisor.drills.localredis import server_binary

    server = server_binary() or "redis-server"  # the binary the private server runs
    return {"nproc": sh(["nproc"]), "free_h": sh(["free", "-h"]), "uname": platform.platform(),
            "cpu": next((line.split(":", 1)[1].strip() for line in
                         Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("model name")), "?"),
            "python": sys.version.split()[0], "server": sh([server, "--version"]),
            "commit": sh(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def raw_limits(port: int, url: str) -> dict[str, Any]:
    """redis-benchmark for PING, LPUSH, LPOP and EVALSHA; a redis-py round-trip loop."""
    out: dict[str, Any] = {}
    exe = shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")
    r = bl.client(url)
    r.flushall()
    if exe:
        base = [exe, "-p", str(port), "-q", "-n", "100000"]
        for label, extra in (("single client (-c 1)", ["-c", "1"]),
                             ("50 clients (default)", [])):
            res: dict[str, float] = {}
            text = subprocess.run([*base, *extra, "-t", "ping,lpush,lpop"], capture_output=True,
                                  text=True, timeout=300).stdout
            sha = r.script_load("return 1")
            text += subprocess.run([*base, *extra, "evalsha", sha, "0"], capture_output=True,
                                   text=True, timeout=300).stdout
            for line in re.split(r"[\r\n]+", text):
                m = re.match(r"\s*([^:]+):\s*([\d.]+) requests per second", line)
                if m:
                    name = m.group(1).strip()
                    res["EVALSHA (return 1)" if name.lower().startswith("evalsha") else name] = \
                        float(m.group(2))
            out[label] = res
        r.flushall()
    n = 20_000
    r.ping()
    t0 = time.perf_counter()
    for _ in range(n):
        r.ping()
    out["redis-py PING loop (1 connection, sequential)"] = n / (time.perf_counter() - t0)
    return out


# --- running the driver ------------------------------------------------------------------------

def sweep(url: str, keep: set[int]) -> int:
    """Kill any process left over from a driver: it has our server's URL in its environment."""
    killed = 0
    for p in psutil.process_iter(["pid"]):
        if p.pid in keep or p.pid == os.getpid():
            continue
        with contextlib.suppress(Exception):
            if p.environ().get("BENCH_REDIS_URL") == url:
                p.kill()
                killed += 1
    return killed


def drive(system: str, url: str, workload: str, timeout: float, keep: set[int],
          **params: Any) -> dict[str, Any]:
    argv = [str(python_for(system)), str(HERE / "driver.py"), "--system", system,
            "--workload", workload, "--redis-url", url]
    for k, v in params.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ, PYTHONPATH=str(HERE))
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(HERE), env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err = f"timed out after {timeout:.0f}s\n{err}"
        proc.returncode = -9
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # any worker still in the driver's group
        left = sweep(url, keep)
        if left:
            log(f"  killed {left} leftover process(es)")
    result: dict[str, Any] = {"system": system, "workload": workload, **params,
                              "elapsed_s": time.perf_counter() - t0}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        result.update(json.loads(lines[-1]))
        result.update(params)
    else:
        result["error"] = (err.strip().splitlines() or ["(no output)"])[-12:]
    return result


def plan(quick: bool, scale_jobs: int, jobs: int | None = None, cap_s: float | None = None
         ) -> list[tuple[str, str, dict[str, Any], float, bool]]:
    """(label, workload, params, timeout, scale?) in the order they run; ``jobs`` and
    ``cap_s`` override the drains' size and their longest measuring window."""
    # >= 200,000 jobs: at EchoMQ's rate 20,000 take ~0.3 s, where a 5 ms poll alone is ±2%;
    # a slower system is measured over the first cap_s seconds of its drain (a timed window)
    j = jobs or (2_000 if quick else 200_000)
    sj = 20_000 if quick else scale_jobs
    idle_s = 4 if quick else 8
    cap = cap_s or (10 if quick else 15)
    return [
        ("drain×1", "drain", {"jobs": j, "processes": 1, "max_s": cap}, 600, False),
        ("drain×2", "drain", {"jobs": j, "processes": 2, "max_s": cap}, 600, False),
        ("1 KiB×1", "drain", {"jobs": j, "processes": 1, "max_s": cap, "kind": "payload"},
         600, False),
        ("cpu×1", "drain", {"jobs": j, "processes": 1, "max_s": cap, "kind": "cpu"}, 600, False),
        ("io×2 (200)", "drain", {"jobs": j, "processes": 2, "max_s": cap, "kind": "io",
                                 "concurrency": 100}, 600, False),
        ("io×2 (2000)", "drain", {"jobs": j, "processes": 2, "max_s": cap, "kind": "io",
                                  "concurrency": 1000}, 600, False),
        ("enqueue", "enqueue", {"jobs": 500 if quick else 5_000, "bulk_jobs": j}, 300, False),
        ("pickup", "pickup", {"jobs": 50 if quick else 200, "processes": 1}, 180, False),
        ("idle×1", "idle", {"seconds": idle_s, "processes": 1}, 180, False),
        ("idle×4", "idle", {"seconds": idle_s, "processes": 4}, 180, False),
        ("delayed", "delayed", {"jobs": 50 if quick else 200, "processes": 1}, 180, False),
        ("scale drain", "drain", {"jobs": sj, "processes": 1, "max_s": cap}, 900, True),
        ("scale delayed memory", "delayed_memory", {"jobs": sj}, 900, True),
    ]


def run_own(quick: bool, scale_jobs: int, runs: int) -> dict[str, Any]:
    """EchoMQ's own benchmarks (bench/*.py --json), each bounded by a timeout."""
    py = str(python_for("echomq"))
    r = 1 if quick else runs
    j = "2000" if quick else "20000"
    big = "20000" if quick else str(scale_jobs)
    specs = {
        "drain": ["drain.py", "--jobs", j, "--runs", str(r)],
        "drain_scale": ["drain.py", "--jobs", big, "--processes", "1,4", "--runs", str(r)],
        "drain_lanes": ["drain.py", "--jobs", big, "--lanes", "10000", "--processes", "1,4",
                        "--runs", str(r)],
        "pickup": ["pickup.py", "--runs", str(r), "--jobs", "50" if quick else "200"],
        "idle": ["idle.py", "--runs", str(r), "--seconds", "4" if quick else "8"],
        "delayed": ["delayed.py", "--runs", str(r), "--standalone"],
        "memory": ["memory.py", "--jobs", j, "--delayed", big],
    }
    if not quick and scale_jobs < 1_000_000:
        # the million itself, once each: EchoMQ fills and drains it in about a minute
        specs["drain_1m"] = ["drain.py", "--jobs", "1000000", "--processes", "4",
                             "--no-standalone", "--runs", "1"]
        specs["memory_1m"] = ["memory.py", "--processes", "", "--delayed", "1000000"]
    out: dict[str, Any] = {}
    for name, argv in specs.items():
        path = RESULTS / f"own-{name}.json"
        log(f"own benchmark {name}: {' '.join(argv)}")
        try:
            proc = subprocess.run([py, str(BENCH / argv[0]), *argv[1:], "--json", str(path)],
                                  cwd=str(BENCH), capture_output=True, text=True, timeout=1200)
            if proc.returncode == 0:
                out[name] = json.loads(path.read_text())
                out[name]["table"] = proc.stdout
            else:
                out[name] = {"error": proc.stderr[-3000:]}
        except subprocess.TimeoutExpired as exc:
            out[name] = {"error": f"timed out: {exc}"}
        if "error" in out[name]:
            log(f"  failed: {out[name]['error'][-300:]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default="", help="labels or workload names; default all")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scale-jobs", type=int, default=200_000,
                    help="jobs for the scale items (1,000,000 would take well over 25 min)")
    ap.add_argument("--quick", action="store_true", help="small sizes and one run")
    ap.add_argument("--jobs", type=int, help="jobs per drain (default 200,000)")
    ap.add_argument("--cap-s", type=float,
                    help="longest drain measuring window, s (default 15): a slower system's "
                    "rate is its completions in that window")
    ap.add_argument("--skip-install", action="store_true")
    ap.add_argument("--skip-own", action="store_true", help="skip EchoMQ's own bench/*.py")
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args()
    started = time.perf_counter()
    systems = [s for s in args.systems.split(",") if s]
    runs = 1 if args.quick else args.runs
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data: dict[str, Any] = {"machine": machine(), "runs": runs, "scale_jobs": args.scale_jobs,
                            "quick": args.quick, "peers": [], "failed": {}, "versions": {},
                            "config": {}}
    if not args.skip_peers:
        data["failed"] = ensure_venvs(systems, args.skip_install)
        for s, err in data["failed"].items():
            log(f"{s}: cannot be installed: {err[-300:]}")
        systems = [s for s in systems if s not in data["failed"]]
        for s in systems:
            data["versions"][s] = versions(s)
            data["config"][s] = _config_of(s)
        steps = plan(args.quick, args.scale_jobs, args.jobs, args.cap_s)
        if args.workloads:
            chosen = set(args.workloads.split(","))
            steps = [st for st in steps if st[0] in chosen or st[1] in chosen]
        with bl.private_redis() as server:
            keep = {server.proc.pid} if server.proc else set()
            log(f"private server {server.url}")
            data["raw"] = raw_limits(server.port, server.url)
            log(f"raw limits: {json.dumps(data['raw'])}")
            for run in range(runs):
                for label, workload, params, timeout, scale in steps:
                    if scale and run > 0:
                        continue  # the scale items run once: see docs/benchmarks.md
                    for s in systems:
                        res = drive(s, server.url, workload, timeout, keep,
                                    **{**params, **({"seed": run} if workload == "delayed"
                                                    else {})})
                        res.update(label=label, run=run)
                        data["peers"].append(res)
                        brief = {k: (round(v, 2) if isinstance(v, float) else v)
                                 for k, v in res.items() if k in (
                                     "rate", "one_rate", "bulk_rate", "p50_ms", "p99_ms",
                                     "per_s", "bytes_per_job", "admit_rate", "complete",
                                     "error")}
                        log(f"run {run + 1}/{runs} {label:<22} {s:<9} {brief}")
                        _save(data, stamp)
    if not args.skip_own and "echomq" in systems:
        data["own"] = run_own(args.quick, args.scale_jobs, runs)
    data["total_s"] = time.perf_counter() - started
    path = _save(data, stamp)
    log(f"results: {path} ({data['total_s'] / 60:.1f} min)")
    if not args.no_report:
        report_py = PEERS_VENV / "bin" / "python"
        py = str(report_py if report_py.exists() else sys.executable)
        subprocess.run([py, str(HERE / "report.py"), str(path)], check=False, timeout=300)
    return 0


def _config_of(system: str) -> str:
    code = f"import peer_{system} as m; print(m.CONFIG)"
    try:
        return subprocess.run([str(python_for(system)), "-c", code], capture_output=True,
                              text=True, timeout=60, cwd=str(HERE),
                              env=dict(os.environ, PYTHONPATH=str(HERE))).stdout.strip()
    except Exception as exc:
        return f"({exc})"


def _save(data: dict[str, Any], stamp: str) -> Path:
    path = RESULTS / f"peers-{stamp}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    (RESULTS / "latest.json").write_text(json.dumps(data, indent=1, default=str))
    return path


if __name__ == "__main__":
    raise SystemExit(main())
