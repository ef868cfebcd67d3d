"""Structured logs: one line per lifecycle event, plain or JSON (``--log-json``)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from echomq.logcontext import JobContextFilter

EVENT_FIELDS = ("event", "queue", "pid", "job_id", "exit", "signal", "delay_s", "count",
                "stalled", "job_name", "lane", "attempt", "max_attempts", "gap_s", "since")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        """One JSON object per record: ts, level, logger, msg, event fields, any traceback."""
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in EVENT_FIELDS:
            if hasattr(record, name):
                out[name] = getattr(record, name)
        if record.exc_info:
            out["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(json_lines: bool, level: str = "INFO") -> None:
    """Send the root logger to stderr as text or JSON lines, at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"))
    handler.addFilter(JobContextFilter())  # job_id, queue, lane, attempt inside a handler
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(logger: logging.Logger, name: str, message: str, *args: Any,
          level: int = logging.INFO, **fields: Any) -> None:
    """Log one lifecycle event with machine-readable fields."""
    logger.log(level, message, *args, extra={"event": name, **fields})
