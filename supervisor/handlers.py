"""Resolve ``module:callable`` handler specs, failing with a message that names the module."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from echomq.errors import HandlerNotFound


def import_handler(spec: str, *, reload: bool = False) -> Callable[..., Any]:
    """Import ``module:callable`` (or ``module:attr.attr``); raise HandlerNotFound otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerNotFound(f"handler {spec!r} must look like 'module:callable'")
    try:
        module = importlib.import_module(module_name)
        if reload:
            module = importlib.reload(module)
    except Exception as exc:  # any error while importing user code is reported, not raised raw
        raise HandlerNotFound(
            f"cannot import handler module {module_name!r} (from {spec!r}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerNotFound(
                f"handler module {module_name!r} has no attribute {attr!r} (from {spec!r})"
            ) from None
    if not callable(target):
        raise HandlerNotFound(f"handler {spec!r} is not callable")
    return target  # type: ignore[no-any-return]
