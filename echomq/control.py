"""What a handler raises to steer its job: ``Retry(delay=)`` and ``Fail(reason)``."""

from __future__ import annotations

import math

from echomq.backoff import MAX_DELAY_S


class Retry(Exception):  # noqa: N818 - named for what the handler asks for
    """Retry this job after ``delay`` seconds (counts an attempt, like any failure); at most
    100 years, as for ``Queue.add``. A bad delay raises ValueError here, in the handler,
    which makes it an ordinary failure of the job."""

    def __init__(self, delay: float = 0.0, reason: str = "") -> None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not (
                math.isfinite(delay) and 0 <= delay <= MAX_DELAY_S):
            raise ValueError(f"Retry delay must be a finite number of seconds from 0 to "
                             f"{MAX_DELAY_S:.0f} (100 years), got {delay!r}")
        self.delay = float(delay)
        self.reason = reason
        super().__init__(f"Retry(delay={self.delay:g})" + (f": {reason}" if reason else ""))


class Fail(Exception):  # noqa: N818 - named for what the handler asks for
    """Fail this job for good: dead at once, whatever attempts remain."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(f"Fail: {reason}" if reason else "Fail")
