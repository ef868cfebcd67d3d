"""Resolve ``module:callable`` handler specs and ``--tasks`` modules, failing with a message
that names the module."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from echomq.errors import HandlerNotFound
from echomq.job import Job

if TYPE_CHECKING:
    from echomq.supervisor.settings import QueueSpec


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
            f"{type(exc).__name__}: {exc}{_search_hint(module_name, exc)}"
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


def import_task_modules(modules: Iterable[str], *, reload: bool = False) -> None:
    """Import (or re-import) modules of ``@echomq.task`` functions; HandlerNotFound naming
    the module that fails."""
    for name in modules:
        try:
            if reload and name in sys.modules:
                importlib.reload(sys.modules[name])
            else:
                importlib.import_module(name)
        except Exception as exc:  # any error while importing user code is reported, not raised
            raise HandlerNotFound(
                f"cannot import task module {name!r} (from --tasks): {type(exc).__name__}: "
                f"{exc}{_search_hint(name, exc)}"
            ) from exc


def _search_hint(module_name: str, exc: BaseException) -> str:
    """Where the module was looked for, when it (or its package) was not found at all."""
    missing = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not missing or not (
            module_name == missing or module_name.startswith(missing + ".")):
        return ""
    path = os.environ.get("PYTHONPATH")
    return (f"; handler and task modules are imported from installed packages, PYTHONPATH "
            f"({path if path else 'not set'}) and the working directory ({os.getcwd()}): "
            "start in the directory that holds the module, or add it to PYTHONPATH")


class TaskHandlers(dict[str, Callable[[Job], Any]]):
    """Handlers by task name; a name no task claims goes to ``fallback`` (``--handler``).

    The fallback is also kept under the empty name (no job has it), so whoever looks
    at every handler (is any of them ``async def``?) sees it too.
    """

    def __init__(self, tasks: Mapping[str, Callable[[Job], Any]],
                 fallback: Callable[..., Any] | None) -> None:
        super().__init__(tasks)
        self.fallback = fallback
        if fallback is not None:
            self[""] = fallback

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """The task registered under ``name``, else the fallback handler, else ``default``."""
        found = super().get(name)
        return found if found is not None else (self.fallback or default)


def load_handler(spec: QueueSpec, *, reload: bool = False) -> Any:
    """What a queue's consumers run: its ``--handler``, its tasks by name, or both."""
    if not spec.tasks:
        return import_handler(spec.handler, reload=reload)
    from echomq.task import tasks_on

    import_task_modules(spec.tasks, reload=reload)
    fallback = import_handler(spec.handler, reload=reload) if spec.handler else None
    return TaskHandlers(tasks_on(spec.name), fallback)
