"""Admits inside a Django transaction wait for its commit (``on_commit``)."""

from __future__ import annotations

from collections.abc import Callable

from django.db import connections, transaction


def at_commit(database: str) -> Callable[[Callable[[], None]], bool]:
    """A deferrer (:mod:`echomq.deferral`) that hands an admit made inside an atomic
    block of ``database`` to ``transaction.on_commit``: it runs after the outermost
    block commits and is dropped when it rolls back. Outside a transaction (or in
    autocommit) it declines, so the admit runs at once."""

    def defer(admit: Callable[[], None]) -> bool:
        if not connections[database].in_atomic_block:
            return False
        transaction.on_commit(admit, using=database)
        return True

    return defer
