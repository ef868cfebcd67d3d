"""Kept for imports of ``echomq.supervisor.localcluster``: the private cluster helper lives
in :mod:`echomq.supervisor.drills.localcluster`; this module re-exports its names."""

from echomq.supervisor.drills.localcluster import (
    NODE_TIMEOUT_MS,
    LocalCluster,
    cli_binary,
    distinct_ports,
)

__all__ = ["NODE_TIMEOUT_MS", "LocalCluster", "cli_binary", "distinct_ports"]
