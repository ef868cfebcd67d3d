"""Retry backoff: exponential with jitter, carried on each job as a compact string."""

from __future__ import annotations

import random
from dataclasses import dataclass

from echomq.errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n is ``min(max, base * factor**(n-1))``, spread by +/- jitter."""

    base: float = 1.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base < 0 or self.max < 0:
            raise ConfigError("backoff base and max must be >= 0 seconds")
        if self.factor < 1:
            raise ConfigError("backoff factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("backoff jitter must be between 0 and 1")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        raw = min(self.max, self.base * self.factor ** max(0, attempt - 1))
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
