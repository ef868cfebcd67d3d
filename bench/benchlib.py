"""Shared pieces of the EchoMQ benchmarks: a private server, processes, tables, statistics.

Every benchmark starts its own ``redis-server`` (``LocalRedis``) on a free
port and stops it afterwards: the shared server at :6379 is never touched.
Consumer processes run in their own session (process group) so a timeout
or a crash of the benchmark can kill the whole tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))



def _load_localredis() -> Any:
    """echomq.supervisor.drills.localredis; in the peers' virtualenvs (no EchoMQ installed),
    the same file loaded by path: it needs only the standard library."""
    try:
        from echomq.supervisor.drills import localredis
        return localredis
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "echomq_bench_localredis", REPO / "supervisor" / "drills" / "localredis.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


LocalRedis = _load_localredis().LocalRedis

LAT_KEY = "bench:lat"  # handlers.record pushes one latency (seconds) per job here


# --- the server ---------------------------------------------------------------------------

@contextlib.contextmanager
def private_redis(extra_args: tuple[str, ...] = ()) -> Iterator[LocalRedis]:
    """A fresh redis-server on a free port, stopped (and its directory removed) on exit."""
    server = LocalRedis(extra_args=extra_args).start()
    try:
        yield server
    finally:
        server.stop()


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=30)


def commandstats(r: redis.Redis) -> dict[str, int]:
    """calls per command from INFO commandstats (includes commands run inside scripts)."""
    out: dict[str, int] = {}
    for name, fields in r.info("commandstats").items():
        cmd = name.removeprefix("cmdstat_")
        out[cmd] = int(fields["calls"])
    return out


def server_info(r: redis.Redis) -> dict[str, Any]:
    info = r.info("server")
    return {"redis_version": info.get("redis_version"), "server_name": info.get("server_name")}


# --- processes -----------------------------------------------------------------------------

def _log_file(tag: str) -> Any:
    return tempfile.NamedTemporaryFile(prefix=f"echomq-bench-{tag}-", suffix=".log",
                                       delete=False, mode="w")


class Proc:
    """A subprocess in its own session, stopped with SIGTERM and killed (group) if it lingers."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: Path | str = BENCH_DIR, tag: str = "proc", own_session: bool = True) -> None:
        self.log = _log_file(tag)
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.argv = list(argv)
        self.own_session = own_session
        self.started = time.perf_counter()
        self.popen = subprocess.Popen(self.argv, cwd=str(cwd), env=full_env, stdout=self.log,
                                      stderr=subprocess.STDOUT, start_new_session=own_session)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL what is left of the tree."""
        descendants = _descendants(self.popen.pid)
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        if self.own_session:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)  # leftovers: forked children
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
        for child in descendants:  # psutil checks the start time: a reused pid is left alone
            with contextlib.suppress(Exception):
                child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self.log.close()
        return self.popen.returncode

    def tail(self, n: int = 20) -> str:
        self.log.flush()
        try:
            return "".join(Path(self.log.name).read_text().splitlines(True)[-n:])
        except OSError:
            return ""

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil

        return list(psutil.Process(pid).children(recursive=True))
    except Exception:  # psutil missing or the process already gone
        return []


def supervisor_argv(url: str, queue: str, handler: str, processes: int, *,
                    beat_ms: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    exe = Path(sys.executable).parent / "echomq-supervisor"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "echomq.supervisor.cli"]
    argv = [*base, "start", "--redis-url", url, "--queue", queue, "--handler", handler,
            "--processes", str(processes), "--log-level", "WARNING"]
    if beat_ms is not None:
        argv += ["--beat-ms", str(beat_ms)]
    return argv + list(extra)


def start_supervisor(url: str, queue: str, handler: str, processes: int, *,
                     beat_ms: int | None = None, extra: Sequence[str] = (),
                     env: dict[str, str] | None = None) -> Proc:
    return Proc(supervisor_argv(url, queue, handler, processes, beat_ms=beat_ms, extra=extra),
                env={"BENCH_REDIS_URL": url, **(env or {})}, tag="supervisor")


def start_consumer(url: str, queue: str, handler: str, *, burst: bool = False,
                   beat_ms: int | None = None, doorbell: str | None = None) -> Proc:
    """One standalone ``echomq.Consumer(...).run()`` process (bench/consumer_proc.py)."""
    argv = [sys.executable, str(BENCH_DIR / "consumer_proc.py"), "--redis-url", url,
            "--queue", queue, "--handler", handler]
    if burst:
        argv.append("--burst")
    if beat_ms is not None:
        argv += ["--beat-ms", str(beat_ms)]
    if doorbell is not None:
        argv += ["--doorbell", doorbell]
    return Proc(argv, env={"BENCH_REDIS_URL": url}, tag="consumer")


def doorbells(text: str) -> list[str]:
    """The ``--doorbell`` option of the benchmarks: kinds to run side by side."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    for kind in kinds:
        if kind not in ("list", "marker"):
            raise SystemExit(f"--doorbell takes list, marker or list,marker; got {kind!r}")
    return kinds


# --- waiting and progress ---------------------------------------------------------------

def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.01,
               what: str = "condition", proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what}: process exited early ({proc.popen.returncode}):\n"
                               f"{proc.tail()}")
        if time.monotonic() > deadline:
            extra = f"\n{proc.tail()}" if proc is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


def completed(r: redis.Redis, queue: str) -> int:
    """The queue's completed total: the same number as ``Queue.counts()["completed"]``, read
    with one HGET instead of the counts script (which walks every lane on the ring)."""
    value = r.hget(f"emq:{{{queue}}}:stats", "completed")
    return int(value) if value else 0


def measure_drain(done: Callable[[], int], total: int, timeout: float, proc: Proc | None = None,
                  interval: float = 0.005, launched: float | None = None) -> dict[str, float]:
    """Poll ``done()`` until it reaches ``total``.

    The clock starts at the first poll that sees progress (so process start-up, which
    differs a lot between systems, is not counted) and stops at the poll that sees
    ``total``: rate = jobs done in between / elapsed. ``wall_s`` is from ``launched``
    (process start) to the end, start-up included.
    """
    launched = time.perf_counter() if launched is None else launched
    deadline = time.monotonic() + timeout
    first_t = first_n = None
    n = 0
    while True:
        n = done()
        now = time.perf_counter()
        if first_t is None and n > 0:
            first_t, first_n = now, n
        if n >= total:
            break
        if proc is not None and not proc.alive():
            raise RuntimeError(f"worker exited early ({proc.popen.returncode}) at {n}/{total}:"
                               f"\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"drain timed out after {timeout:.0f}s at {n}/{total}")
        time.sleep(interval)
    assert first_t is not None and first_n is not None
    elapsed = max(now - first_t, 1e-9)
    return {"jobs": total, "rate": (n - first_n) / elapsed if n > first_n else total / elapsed,
            "drain_s": elapsed, "wall_s": now - launched, "boot_s": first_t - launched}


def collect_latencies(r: redis.Redis, count: int, timeout: float,
                      proc: Proc | None = None) -> list[float]:
    wait_until(lambda: r.llen(LAT_KEY) >= count, timeout, 0.02, f"{count} handler starts", proc)
    return [float(x) for x in r.lrange(LAT_KEY, 0, -1)]


# --- statistics and output ----------------------------------------------------------------

def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank), p in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def summary(runs: Sequence[float]) -> dict[str, float]:
    """Median of the runs with min and max."""
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs),
            "runs": len(runs)}


def fmt_range(s: dict[str, float], fmt: str = "{:,.0f}") -> str:
    if s.get("runs", 1) <= 1:
        return fmt.format(s["median"])
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def emit_json(path_or_dash: str | None, data: Any) -> None:
    """``--json -`` prints JSON to stdout; ``--json FILE`` writes it."""
    if not path_or_dash:
        return
    text = json.dumps(data, indent=2, default=str)
    if path_or_dash == "-":
        print(text)
    else:
        Path(path_or_dash).write_text(text + "\n")


def unique_queue(tag: str) -> str:
    return f"bench-{tag}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"


def admit_noop(q: Any, total: int, lanes: int = 1, chunk: int = 20_000) -> float:
    """Bulk-admit ``total`` no-op jobs over ``lanes`` lanes; returns the admit rate (jobs/s)."""
    t0 = time.perf_counter()
    done = 0
    while done < total:
        n = min(chunk, total - done)
        if lanes <= 1:
            jobs = [("noop", None)] * n
        else:
            jobs = [("noop", None, {"lane": f"l{(done + i) % lanes}"}) for i in range(n)]
        q.add_many(jobs)
        done += n
    return total / (time.perf_counter() - t0)
