"""Retry backoff: exponential with jitter, carried on each job as a compact string."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from echomq.errors import ConfigError

# the longest delay anything schedules: a retry computed longer waits this long instead
MAX_DELAY_S = 100 * 365.25 * 86_400  # 100 years
MAX_DELAY_MS = int(MAX_DELAY_S * 1000)


def retry_pause(failures: int, cap: float, doublings: int = 6) -> float:
    """How long to wait before reaching the server again after ``failures`` failures in
    a row: 50 ms doubled with each (``doublings`` times at most), at most ``cap`` s."""
    return min(cap, 0.05 * 2 ** min(failures, doublings))


def delay_ms(seconds: float) -> int:
    """A delay as whole ms from 0 to MAX_DELAY_MS (100 years): longer ones, infinity
    included, are clamped to it; negative ones and NaN are 0."""
    if not seconds > 0:  # NaN too
        return 0
    if seconds >= MAX_DELAY_S:
        return MAX_DELAY_MS
    return int(seconds * 1000)


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n is ``min(max, base * factor**(n-1))``, spread by +/- jitter.

    Every field is a finite number (ConfigError otherwise); a delay computed past 100
    years (a large ``max``) is 100 years."""

    base: float = 1.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (self.base, self.factor, self.max, self.jitter)):
            raise ConfigError(f"backoff base, factor, max and jitter must be finite numbers, "
                              f"got {self.encode()}")
        if self.base < 0 or self.max < 0:
            raise ConfigError("backoff base and max must be >= 0 seconds")
        if self.factor < 1:
            raise ConfigError("backoff factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("backoff jitter must be between 0 and 1")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        try:
            raw = min(self.max, self.base * self.factor ** max(0, attempt - 1))
        except OverflowError:  # factor ** (attempt - 1) past what a float holds: past max
            raw = self.max if self.base > 0 else 0.0
        if self.jitter:
            raw *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, raw)

    def encode(self) -> str:
        """The backoff as `base:factor:max:jitter`, the form a job hash stores."""
        return f"{self.base!r}:{self.factor!r}:{self.max!r}:{self.jitter!r}"

    @classmethod
    def decode(cls, text: str) -> Backoff | None:
        """Parse :meth:`encode`'s output; None for an empty or malformed string."""
        try:
            base, factor, max_, jitter = (float(part) for part in text.split(":"))
            return cls(base, factor, max_, jitter)
        except (ValueError, ConfigError):
            return None

    @classmethod
    def coerce(cls, value: Backoff | float | int | None) -> Backoff | None:
        """Accept seconds (first retry delay, doubling) or a Backoff; None stays None."""
        if value is None or isinstance(value, Backoff):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"backoff must be seconds or an echomq.Backoff, got {value!r}")
        if value < 0:
            raise ConfigError(f"backoff must be >= 0 seconds, got {value!r}")
        return cls(base=float(value))
