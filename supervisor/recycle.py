"""Resource checks with psutil: children over a memory limit, the supervisor's own figures."""

from __future__ import annotations

import os

import psutil


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process, or None when it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def over_memory(pid: int, limit_mb: int) -> bool:
    """True when the process's RSS exceeds ``limit_mb`` MiB."""
    rss = rss_bytes(pid)
    return rss is not None and rss > limit_mb * 1024 * 1024


def own_figures() -> dict[str, float]:
    """The supervisor's own RSS, CPU seconds and open fds."""
    proc = psutil.Process(os.getpid())
    cpu = proc.cpu_times()
    return {
        "rss_bytes": float(proc.memory_info().rss),
        "cpu_seconds": float(cpu.user + cpu.system),
        "open_fds": float(proc.num_fds()),
    }
