"""Admit jobs into many queues in one pipeline, grouped by cluster slot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from echomq import pools, scripts
from echomq.connection import Client, connect, describe, slot_of, translated
from echomq.queue import Queue


def add_many(jobs_by_queue: Mapping[str, Iterable[Sequence[Any] | Mapping[str, Any]]],
             redis_url: str | None = None, *, redis: Client | None = None,
             **settings: Any) -> dict[str, list[str]]:
    """Admit jobs into several queues at once; returns the job ids per queue.

    Jobs are given per queue as :meth:`Queue.add_many` takes them, and every one is
    validated before anything is sent. Each script call touches one queue, so one
    slot; the calls are ordered by slot and sent in one pipeline, which a cluster
    client splits into one batch per node. Nothing here spans two slots.
    """
    client = redis if redis is not None else connect(redis_url or pools.default_url())
    queues = {name: Queue(name, redis=client, **settings) for name in jobs_by_queue}
    planned = {name: queues[name].specs(jobs) for name, jobs in jobs_by_queue.items()}
    specs = {name: plan[0] for name, plan in planned.items()}
    on_floor = {name: bool(specs[name]) and queues[name].must_floor() for name in specs}
    calls = []
    for name in sorted(specs, key=lambda n: slot_of(queues[n].keys.prefix)):
        calls += queues[name].calls(specs[name])
    if calls:
        with translated(describe(client)):
            for name, queue in queues.items():
                if specs[name]:
                    queue.register()
            scripts.execute(client, calls)
    for name, queue in queues.items():
        if specs[name]:
            queue.after_admit(specs[name], planned[name][1], on_floor[name])
    return {name: [s[0] for s in specs[name]] for name in specs}
