"""Handlers the access tests run in real forked consumers."""

from __future__ import annotations

import os


def environ(job) -> str | None:  # type: ignore[no-untyped-def]
    """The value of the environment variable ``payload["name"]`` in the consumer's process."""
    return os.environ.get(job.payload["name"])
