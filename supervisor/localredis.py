"""Kept for imports of ``echomq.supervisor.localredis``: the private server helper lives
in :mod:`echomq.supervisor.drills.localredis`; this module re-exports its names."""

from echomq.supervisor.drills.localredis import (
    BINARY_ENV,
    READY_MARKER,
    LocalRedis,
    embedded_valkey,
    free_port,
    server_binary,
)

__all__ = ["BINARY_ENV", "READY_MARKER", "LocalRedis", "embedded_valkey", "free_port",
           "server_binary"]
