"""What a handler raises to steer its job: ``Retry(delay=)`` and ``Fail(reason)``."""

from __future__ import annotations

import math


class Retry(Exception):  # noqa: N818 - named for what the handler asks for
    """Retry this job after ``delay`` seconds (counts an attempt, like any failure)."""

    def __init__(self, delay: float = 0.0, reason: str = "") -> None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not (
                math.isfinite(delay) and delay >= 0):
            raise ValueError(f"Retry delay must be a finite number of seconds >= 0, got {delay!r}")
        self.delay = float(delay)
        self.reason = reason
        super().__init__(f"Retry(delay={self.delay:g})" + (f": {reason}" if reason else ""))


class Fail(Exception):  # noqa: N818 - named for what the handler asks for
    """Fail this job for good: dead at once, whatever attempts remain."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(f"Fail: {reason}" if reason else "Fail")
