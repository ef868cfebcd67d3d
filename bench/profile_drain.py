"""Where a drain spends its time: CPU split between the server and the consumers, and a
py-spy profile of the consumer processes.

    .venv/bin/python bench/profile_drain.py                       # standalone, 200,000 jobs
    .venv/bin/python bench/profile_drain.py --supervisor 1 --jobs 100000
    .venv/bin/python bench/profile_drain.py --no-py-spy            # CPU split only

py-spy is not a dependency: it is looked up on PATH and in ``bench/.peers-venv/bin``
(``bench/.peers-venv/bin/pip install py-spy``). The profile is written as collapsed
stacks (``--out``, default /tmp/echomq-drain.collapsed, loadable in speedscope) and
the functions with the most own samples are printed.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import time
from pathlib import Path

import benchlib as bl
import psutil

import echomq


def py_spy() -> str | None:
    local = bl.BENCH_DIR / ".peers-venv" / "bin" / "py-spy"
    return shutil.which("py-spy") or (str(local) if local.exists() else None)


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its children, living or reaped."""
    try:
        p = psutil.Process(pid)
        total = sum(p.cpu_times()[:4])
        for c in p.children(recursive=True):
            try:
                total += sum(c.cpu_times()[:2])
            except psutil.NoSuchProcess:
                pass
        return total
    except psutil.NoSuchProcess:
        return 0.0


def summarize(path: Path, top: int) -> list[tuple[str, float, float]]:
    """(function, own %, inclusive %) from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        count = int(n)
        frames = [f for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    rows = [(f, 100 * c / total, 100 * incl[f] / total) for f, c in own.most_common(top)]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--supervisor", type=int, default=0, help="processes; 0 = standalone")
    ap.add_argument("--no-py-spy", action="store_true")
    ap.add_argument("--out", default="/tmp/echomq-drain.collapsed")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with bl.private_redis() as server:
        r = bl.client(server.url)
        name = bl.unique_queue("prof")
        q = echomq.Queue(name, redis_url=server.url)
        bl.admit_noop(q, args.jobs)
        assert server.proc is not None
        srv_cpu0 = tree_cpu(server.proc.pid)
        if args.supervisor:
            proc = bl.start_supervisor(server.url, name, "handlers:noop", args.supervisor)
        else:
            proc = bl.start_consumer(server.url, name, "handlers:noop", burst=True)
        spy = None
        spy_exe = None if args.no_py_spy else py_spy()
        if spy_exe:
            spy = subprocess.Popen([spy_exe, "record", "--pid", str(proc.pid), "--subprocesses",
                                    "--rate", "250", "--format", "raw", "--output", args.out,
                                    "--nonblocking"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        t0 = time.perf_counter()
        peak_cpu = 0.0
        try:
            res = bl.measure_drain(lambda: bl.completed(r, name), args.jobs, 600, launched=t0)
            peak_cpu = tree_cpu(proc.pid)
        finally:
            if spy is not None:
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                try:
                    spy.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    spy.kill()
            proc.stop()
        wall = time.perf_counter() - t0
        srv_cpu = tree_cpu(server.proc.pid) - srv_cpu0
        q.close()
    print(f"drained {args.jobs:,} jobs at {res['rate']:,.0f} jobs/s "
          f"({'supervisor ×' + str(args.supervisor) if args.supervisor else 'standalone'})")
    print(f"CPU over {wall:.1f} s: redis-server {srv_cpu:.1f} s "
          f"({100 * srv_cpu / wall:.0f}% of a core), consumer tree {peak_cpu:.1f} s "
          f"({100 * peak_cpu / wall:.0f}%)")
    out = Path(args.out)
    if spy_exe and out.exists():
        rows = summarize(out, args.top)
        bl.print_table(f"py-spy: functions with the most own samples ({out})",
                       ["function (file:line)", "own %", "inclusive %"],
                       [[f[:110], f"{o:.1f}", f"{i:.1f}"] for f, o, i in rows])
    elif not args.no_py_spy:
        print("py-spy not found: bench/.peers-venv/bin/pip install py-spy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
