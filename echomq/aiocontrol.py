"""The asyncio producer's adds with ``expires`` or ``debounce`` (see echomq.expiry and
echomq.debouncing), and its queue-wide limit; kept apart from echomq.aio."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from echomq import debouncing, expiry, queuelimit, scripts
from echomq.connection import translated
from echomq.wake import NOW_MEMBER

if TYPE_CHECKING:
    from echomq.aio import Queue


async def add(aq: Queue, name: str, payload: Any, *, expires: Any, debounce: Any,
              debounce_s: Any, debounce_max_s: Any, **options: Any) -> str:
    """One add with an expiry or a debounce key; the job's id."""
    from echomq.aio import evalsha, execute_atomically

    if debounce is not None or debounce_s is not None or debounce_max_s is not None:
        script, keys, args = debouncing.call(aq._plan, name, payload, debounce, debounce_s,
                                             debounce_max_s, expires=expires, **options)
        # a deferred job: "sync" and "durable" keep it on the floor, its row rewritten by
        # every add it gathers
        keep = await aq._floor_sync([], deferred=True)
        await aq._register()
        with translated(aq.where), debouncing.clashes():
            jid = debouncing.job_id_of(await evalsha(aq.redis, script, keys, args))
        if keep:
            await aq._write_current(jid)
        return jid
    until = expiry.expires_arg(expires)
    spec = aq._plan.spec(name, payload, options["lane"], options["delay"], options["run_at"],
                         options["job_id"], options["max_attempts"], options["backoff"],
                         options["timeout"], options["dedup_s"], options["priority"])
    [calls] = aq._plan.marked_calls([spec], {0: until})
    keep = await aq._floor_sync([spec])  # before the admit: a missing floor admits nothing
    await aq._register()
    with translated(aq.where):
        await execute_atomically(aq.redis, calls)
    if keep:
        await aq._write_through([spec])
    return spec[0]


async def set_queue_limit(aq: Queue, value: str) -> None:
    """Record (or clear) the queue-wide limit and ring; see Queue.set_queue_limit."""
    from echomq.aio import evalsha

    await aq._register()
    with translated(aq.where):
        await evalsha(aq.redis, scripts.LIMIT, scripts.limit_keys(aq.keys),
                      [aq.keys.prefix, queuelimit.FIELD, value])
        kind = await aq.redis.hget(aq.keys.meta, "doorbell")
        kind = (kind.decode() if isinstance(kind, bytes) else kind) or "list"
        if kind == "marker":
            await aq.redis.zadd(aq.keys.marker, {NOW_MEMBER: 0})
        else:
            await aq.redis.lpush(aq.keys.wake, "1")
            await aq.redis.ltrim(aq.keys.wake, 0, 63)
