"""Middleware: a user's code around each admit and each job run.

Subclass :class:`Middleware` and define any of its methods; the others cost nothing
(only the methods a class overrides are ever called). Give instances to
``Queue(..., middleware=[...])``, ``aio.Queue``, ``Consumer`` or, by ``MODULE:NAME``,
to ``echomq-supervisor start --middleware`` (a class or factory there is called once in
each forked consumer).

Which hook may stop what:

- ``before_add`` may veto: an exception it raises propagates out of ``add()`` /
  ``add_many()`` and nothing of that call is admitted.
- ``before_job``, ``after_job`` and ``on_failure`` may not: an exception they raise is
  logged (logger ``echomq.middleware``) and the job runs and settles as it would have.

With an ``async def`` handler, ``before_job``, ``after_job`` and ``on_failure`` may be
``async def`` too (awaited on the handler's loop). With a sync handler they are called in
the handler's thread, so they must be sync (an awaitable one returns is logged and
dropped). ``aio.Queue`` awaits an ``async def before_add``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from echomq.errors import HandlerNotFound
from echomq.job import Job

log = logging.getLogger("echomq.middleware")
HOOKS = ("before_add", "before_job", "after_job", "on_failure")


class Middleware:
    """Base class of middleware; every method is optional (a no-op here)."""

    def before_add(self, queue: str, job_id: str, name: str, payload: Any) -> Any:
        """Producer side, before a job is sent; raise to admit nothing of the call."""

    def before_job(self, job: Job) -> Any:
        """Consumer side, right before the handler is called."""

    def after_job(self, job: Job, result: Any) -> Any:
        """Consumer side, after the handler returned ``result`` (before it is stored)."""

    def on_failure(self, job: Job, exc: BaseException, will_retry: bool) -> Any:
        """Consumer side, after the handler raised ``exc`` (or ran past its time limit);
        ``will_retry``: the job gets another attempt (else it is dead)."""


def _overridden(mw: Any, hook: str) -> Callable[..., Any] | None:
    """The bound hook when ``mw`` defines it itself (not Middleware's no-op)."""
    fn = getattr(type(mw), hook, None)
    if fn is None or fn is getattr(Middleware, hook):
        return None
    return getattr(mw, hook)  # type: ignore[no-any-return]


class Hooks:
    """The overridden hooks of a list of middleware, called in order; None when empty
    (see :func:`hooks_of`), so a caller without middleware pays one ``is None`` test."""

    def __init__(self, middleware: Sequence[Any]) -> None:
        self.middleware = tuple(middleware)
        self.before_add_fns = self._collect("before_add")
        self.before_fns = self._collect("before_job")
        self.after_fns = self._collect("after_job")
        self.failure_fns = self._collect("on_failure")

    def _collect(self, hook: str) -> tuple[Callable[..., Any], ...]:
        return tuple(fn for mw in self.middleware if (fn := _overridden(mw, hook)) is not None)

    # --- producer side: may veto ----------------------------------------------------

    def before_add(self, queue: str, job_id: str, name: str, payload: Any) -> None:
        """Call every before_add; an exception propagates (the add is refused)."""
        for fn in self.before_add_fns:
            result = fn(queue, job_id, name, payload)
            if inspect.isawaitable(result):
                _drop(result, fn)
                raise TypeError(f"{_name(fn)} is async: give it to echomq.aio.Queue")

    async def before_add_async(self, queue: str, job_id: str, name: str, payload: Any) -> None:
        """Call (and await) every before_add; an exception propagates."""
        for fn in self.before_add_fns:
            result = fn(queue, job_id, name, payload)
            if inspect.isawaitable(result):
                await result

    # --- consumer side: never fail the job --------------------------------------------

    def call(self, fns: Iterable[Callable[..., Any]], *args: Any) -> None:
        """Call sync hooks; whatever they raise is logged."""
        for fn in fns:
            try:
                result = fn(*args)
            except Exception:
                log.exception("middleware %s raised (ignored)", _name(fn))
                continue
            if result is not None and inspect.isawaitable(result):
                _drop(result, fn)
                log.error("middleware %s is async but the handler is sync: not awaited",
                          _name(fn))

    async def call_async(self, fns: Iterable[Callable[..., Any]], *args: Any) -> None:
        """Call hooks, awaiting async ones; whatever they raise is logged."""
        for fn in fns:
            try:
                result = fn(*args)
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("middleware %s raised (ignored)", _name(fn))

    def wrap(self, fn: Callable[[Job], Any], is_async: bool) -> Callable[[Job], Any]:
        """The handler with before_job and after_job around it (sync or async alike)."""
        if not self.before_fns and not self.after_fns:
            return fn
        if is_async:
            async def hooked_async(job: Job) -> Any:
                await self.call_async(self.before_fns, job)
                result = await fn(job)
                await self.call_async(self.after_fns, job, result)
                return result
            return hooked_async

        def hooked(job: Job) -> Any:
            self.call(self.before_fns, job)
            result = fn(job)
            self.call(self.after_fns, job, result)
            return result
        return hooked


def hooks_of(middleware: Sequence[Any] | None) -> Hooks | None:
    """Hooks of the given middleware, or None when there is none to call."""
    if not middleware:
        return None
    hooks = Hooks(middleware)
    if not (hooks.before_add_fns or hooks.before_fns or hooks.after_fns or hooks.failure_fns):
        return None
    return hooks


def build(target: Any) -> Any:
    """A middleware instance from what a ``MODULE:NAME`` names: a class or factory is
    called (once per consumer process), an instance is used as it is."""
    if inspect.isclass(target) or inspect.isfunction(target):
        return target()
    return target


def import_middleware(spec: str) -> Any:
    """Import what ``MODULE:NAME`` names (not yet built); HandlerNotFound otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerNotFound(f"middleware {spec!r} must look like 'module:name'")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # user code: reported with the spec, not raised raw
        raise HandlerNotFound(f"cannot import middleware module {module_name!r} (from "
                              f"{spec!r}): {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerNotFound(f"middleware module {module_name!r} has no attribute "
                                  f"{attr!r}") from None
    if not inspect.isclass(target) and not inspect.isfunction(target) and not any(
            callable(getattr(target, h, None)) for h in HOOKS):
        raise HandlerNotFound(f"middleware {spec!r} is neither a class, a factory nor an "
                              f"object with any of {', '.join(HOOKS)}")
    return target


def _name(fn: Callable[..., Any]) -> str:
    owner = getattr(fn, "__self__", None)
    return f"{type(owner).__name__}.{fn.__name__}" if owner is not None else repr(fn)


def _drop(awaitable: Any, fn: Callable[..., Any]) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # no "never awaited" warning on top of the error
