"""The durable floor: deferred and retried jobs kept in SQL (SQLite or PostgreSQL)."""

from __future__ import annotations

from echomq.extras import require

require("floor", "the EchoMQ floor")

from echomq.floor.engine import make_engine, redact_url  # noqa: E402
from echomq.floor.store import Floor, FloorRow  # noqa: E402

__all__ = ["Floor", "FloorRow", "make_engine", "redact_url"]
