"""The durable floor: deferred and retried jobs kept in SQL (SQLite or PostgreSQL)."""

from __future__ import annotations

from echomq.floor.engine import make_engine, redact_url
from echomq.floor.store import Floor, FloorRow

__all__ = ["Floor", "FloorRow", "make_engine", "redact_url"]
