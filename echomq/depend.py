"""Dependencies between jobs: what ``add(..., after=[...])`` sends, and what a handler's
``job.dependency_results()`` reads. Nothing here but building calls and parsing replies.

A job with dependencies is admitted by ``block.lua``: ``blocked`` until every
dependency completed, then on its lane like any admitted job. The fan-in is counted
by the scripts that end jobs (``deps.lua``, included by settle, bury, reap and
cancel), each dependency's first end only. See docs/workflows.md.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.exceptions

from echomq import scripts
from echomq.admit import ADMIT_BATCH, Call, Spec
from echomq.errors import UnknownDependency
from echomq.keys import Keys, validate_job_id

MAX_DEPENDENCIES = 10_000  # dependencies of one job
MAX_DEPENDENTS = 1_000  # jobs waiting for one job: one completion releases at most this many
MAX_DEPTH = 1_000  # blocked jobs in a chain: one death ends at most this many in a row
ON_DEP_FAILURE = ("fail", "run")
TOMBSTONES = 100_000  # ids kept after retention or purge dropped them (settle.lua, records.lua)
CALL_VALUES = 20_000  # dependency ids per block.lua call (one job over it still goes alone)

# a job with dependencies: its admit spec, on_dep_failure and its dependency ids
Blocked = tuple[Spec, str, list[str]]


def dependencies(after: Any, on_dep_failure: Any = "fail") -> list[str]:
    """Validate ``after`` (job ids) and ``on_dep_failure``; the ids, each once, in order."""
    if on_dep_failure not in ON_DEP_FAILURE:
        raise ValueError(f"on_dep_failure must be 'fail' or 'run', got {on_dep_failure!r}")
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise TypeError(f"after must be a list of job ids, got {after!r:.100}")
    ids = list(dict.fromkeys(validate_job_id(a) for a in after))
    if len(ids) > MAX_DEPENDENCIES:
        raise ValueError(f"a job may wait for at most {MAX_DEPENDENCIES:,} dependencies, "
                         f"got {len(ids):,}")
    return ids


def blocked(spec: Spec, after: list[str], on_dep_failure: str) -> Blocked:
    """One job with dependencies, checked: it cannot also be deferred, nor wait for itself."""
    if spec[2] is not None:
        raise ValueError("a job with dependencies (after=) cannot also take delay or run_at")
    if len(after) > MAX_DEPENDENCIES:
        raise ValueError(f"a job may wait for at most {MAX_DEPENDENCIES:,} dependencies, "
                         f"got {len(after):,}")
    if spec[0] in after:
        raise ValueError(f"job {spec[0]!r} cannot depend on itself")
    return spec, on_dep_failure, after


def calls(k: Keys, jobs: Sequence[Blocked]) -> list[Call]:
    """The block.lua calls admitting ``jobs`` in order (one pipeline). The first call also
    checks every dependency the batch names from outside it, with the batch's totals
    (:func:`limits`), so an unknown id or a limit fails before anything is written."""
    chunks: list[list[Blocked]] = []
    start = values = 0
    for i, job in enumerate(jobs):
        if i > start and (i - start >= ADMIT_BATCH or values + len(job[2]) > CALL_VALUES):
            chunks.append(list(jobs[start:i]))
            start, values = i, 0
        values += len(job[2])
    if start < len(jobs):
        chunks.append(list(jobs[start:]))
    outside = limits(jobs)
    batch = uuid.uuid4().hex if len(chunks) > 1 else ""  # a refusal stops the later calls
    checks = [v for d, (count, height) in outside.items() for v in (d, count, height)]
    out: list[Call] = []
    for n, chunk in enumerate(chunks):
        extra = checks if n == 0 else []
        args: list[Any] = [k.prefix, len(chunk), batch, len(extra) // 3, *extra]
        for spec, fail, after in chunk:
            args += [*spec[1], fail, len(after), *after]
        out.append((scripts.BLOCK, [k.waitdeps, k.events], args))
    return out


def limits(jobs: Sequence[Blocked]) -> dict[str, tuple[int, int]]:
    """Check the batch against MAX_DEPENDENTS and MAX_DEPTH as far as it alone decides
    (ValueError, nothing sent); for each dependency outside it: how many of its jobs wait
    for it and the longest chain of them below it (block.lua adds what stands already)."""
    ids = {spec[0] for spec, _, _ in jobs}
    below: dict[str, list[str]] = {}
    for spec, _, after in jobs:
        for d in dict.fromkeys(after):
            below.setdefault(d, []).append(spec[0])
    for d, waiting in below.items():
        if len(waiting) > MAX_DEPENDENTS:
            raise ValueError(f"at most {MAX_DEPENDENTS:,} jobs may wait for one job: "
                             f"{len(waiting):,} wait for {d!r} (nothing was admitted)")
    depth: dict[str, int] = {}
    for spec, _, after in jobs:  # a job comes after what it waits for in the batch
        depth[spec[0]] = max((depth.get(d, 0) + 1 for d in after), default=0)
        if depth[spec[0]] > MAX_DEPTH:
            raise ValueError(f"a chain of blocked jobs may be at most {MAX_DEPTH:,} deep: "
                             f"{spec[0]!r} would be deeper (nothing was admitted)")
    height: dict[str, int] = {}
    for spec, _, _ in reversed(jobs):
        height[spec[0]] = 1 + max((height.get(w, 0) for w in below.get(spec[0], ())),
                                  default=0)
    return {d: (len(w), max(height[j] for j in w)) for d, w in below.items() if d not in ids}


def split(jobs: Iterable[Sequence[Any] | Mapping[str, Any]]
          ) -> tuple[list[Sequence[Any] | Mapping[str, Any]], list[tuple[list[str], str] | None]]:
    """add_many's jobs without their ``after``/``on_dep_failure`` options, and those
    options per job (None for a job without dependencies)."""
    plain: list[Sequence[Any] | Mapping[str, Any]] = []
    deps: list[tuple[list[str], str] | None] = []
    for item in jobs:
        opts: Mapping[str, Any] = item if isinstance(item, Mapping) else (
            item[2] if len(item) > 2 else {})
        if "after" not in opts and "on_dep_failure" not in opts:
            plain.append(item)
            deps.append(None)
            continue
        rest = {k: v for k, v in opts.items() if k not in ("after", "on_dep_failure")}
        after = dependencies(opts.get("after", []), opts.get("on_dep_failure", "fail"))
        plain.append(rest if isinstance(item, Mapping) else (*item[:2], rest))
        deps.append((after, opts.get("on_dep_failure", "fail")))
    return plain, deps


def plan(k: Keys, specs: Sequence[Spec], deps: Sequence[tuple[list[str], str] | None],
         plain_calls: Any) -> list[Call]:
    """The calls of an add_many holding jobs with dependencies: deferred jobs without any
    by ``plain_calls`` (schedule.lua), then the rest, in order, by block.lua."""
    deferred = [s for s, d in zip(specs, deps, strict=True) if d is None and s[2] is not None]
    rest = [blocked(s, d[0] if d else [], d[1] if d else "fail")
            for s, d in zip(specs, deps, strict=True) if d is not None or s[2] is None]
    return [*(plain_calls(deferred) if deferred else []), *calls(k, rest)]


def translate(exc: redis.exceptions.ResponseError) -> Exception:
    """block.lua's refusal as UnknownDependency; any other error as it is."""
    text = str(exc)
    if "unknown dependency " in text:
        return UnknownDependency(text.split("unknown dependency ", 1)[1].split()[0])
    if "too many dependents " in text:
        dep = text.split("too many dependents ", 1)[1].split()[0]
        return ValueError(f"at most {MAX_DEPENDENTS:,} jobs may wait for one job: {dep!r} "
                          "has that many already (nothing was admitted)")
    if "too deep " in text:
        dep = text.split("too deep ", 1)[1].split()[0]
        return ValueError(f"a chain of blocked jobs may be at most {MAX_DEPTH:,} deep: "
                          f"{dep!r} sits too deep for it (nothing was admitted)")
    if "spilled dependency " in text:
        dep = text.split("spilled dependency ", 1)[1].split()[0]
        return ValueError(f"dependency {dep!r} is due beyond the spill horizon and held by the "
                          "floor: a job can wait for it once it is back in Valkey (nothing "
                          "was admitted)")
    return exc


def parse_results(after: bytes | str | None, marks: Sequence[bytes | str | None]
                  ) -> dict[str, Any]:
    """{dependency id: result} of the completed dependencies, in ``after``'s order."""
    ids = _text(after).split() if after else []
    out: dict[str, Any] = {}
    for dep, mark in zip(ids, marks, strict=True):
        text = _text(mark) if mark is not None else ""
        if text.startswith("c"):
            try:
                out[dep] = json.loads(text[1:])
            except (ValueError, RecursionError):
                out[dep] = text[1:]
    return out


def read_results(client: redis.Redis, k: Keys, job_id: str) -> dict[str, Any]:
    """The results of a job's completed dependencies, in one read of its hash (the marks
    are there, copied in as each dependency ended)."""
    h = {_text(f): v for f, v in client.hgetall(k.job(job_id)).items()}
    after = h.get("after")
    if not after:
        return {}
    return parse_results(after, [h.get(f"dep:{d}") for d in _text(after).split()])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
