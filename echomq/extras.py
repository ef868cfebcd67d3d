"""Optional dependencies, grouped by the install extra that brings them.

The base install (``pip install echomq``) is what a producer needs; the
supervisor and the floor need the ``[supervisor]`` extra; a producer that adds crons
needs ``[cron]`` (croniter, to check the expression before it is stored). Importing a part
whose extra is missing raises :class:`echomq.MissingExtra` naming the extra.
"""

from __future__ import annotations

import importlib.util

from echomq.errors import MissingExtra

EXTRAS: dict[str, tuple[str, ...]] = {
    "supervisor": ("sqlalchemy", "alembic", "psutil", "croniter"),
    "floor": ("sqlalchemy", "alembic"),
    "cron": ("croniter",),
    "sentry": ("sentry_sdk",),
}


def require(extra: str, feature: str) -> None:
    """Raise MissingExtra unless every module of ``extra`` can be imported."""
    missing = [m for m in EXTRAS[extra] if not _importable(m)]
    if missing:
        raise MissingExtra(
            f"{feature} needs {', '.join(missing)}: pip install 'echomq[{extra}]'"
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or half-imported module
        return False
