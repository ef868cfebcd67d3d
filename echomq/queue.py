"""The producer side: admit jobs, look them up, count them, re-admit dead ones.

:class:`Queue` does the I/O: what an admit sends is built by
:class:`echomq.admit.AdmitPlanner` (shared with :class:`echomq.aio.Queue`); here are
the round trips, the durability dial's reads and its write-through to the floor, the
listings, pause and cancel, crons and lane limits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis
import redis.exceptions

from echomq import (
    cron,
    debouncing,
    deferral,
    depend,
    durable,
    events,
    expiry,
    pools,
    protocol,
    queuelimit,
    results,
    scripts,
    stopping,
)
from echomq.admit import AdmitPlanner, Call, Spec, added, deferred_ids, has_deferred, refuse_mixed
from echomq.backoff import Backoff
from echomq.config import MAX_LIMIT, QueueSettings
from echomq.connection import (
    client_from_url,
    describe,
    is_cluster,
    node_client,
    redact_url,
    translated,
    wait_replicas,
)
from echomq.errors import CorruptJob, FloorError, NotReplicated
from echomq.events import Event
from echomq.job import STATES, Job
from echomq.keys import REGISTRY, Keys, validate_job_id, validate_name
from echomq.middleware import hooks_of
from echomq.tracing import note_message_id, producer_span

REPLICA_WAIT_MS = 1000  # durability "sync": how long an admit waits for a replica's ack
PURGE_BATCH = 1000  # jobs per purge call: one call stays short
PURGEABLE = ("completed", "dead", "cancelled")


class Queue:
    """A named queue on a Valkey/Redis server.

    ``Queue("emails", redis_url="redis://...")`` or ``Queue("emails", redis=client)``.
    Settings come from ``settings=QueueSettings(...)`` and/or keyword overrides
    (``Queue("q", max_payload_bytes=4096)``). ``floor=``: an ``echomq.floor.Floor`` or a
    floor URL, for the "sync" and "durable" dials (``durability="durable"``: every job is
    on the floor before ``add``/``add_many`` returns; docs/durability.md).
    """

    _waiters: redis.ConnectionPool | None  # result() parks on these; made on first use

    def __init__(
        self,
        name: str,
        redis_url: str | None = None,
        *,
        redis: redis.Redis | None = None,
        settings: QueueSettings | None = None,
        floor: Any = None,
        middleware: Sequence[Any] = (),
        **overrides: Any,
    ) -> None:
        self.name = validate_name(name)
        # an echomq.floor.Floor (or its URL): when the queue's dial is "sync", add() writes
        # deferred jobs to it; "durable": every job (echomq.durable)
        self.floor = durable.as_floor(floor)
        # echomq.Middleware: before_add here; a Consumer given this Queue runs the others
        self.middleware = list(middleware)
        self._hooks = hooks_of(self.middleware)
        self.settings = (settings or pools.default_settings()).with_overrides(**overrides)
        # what an admit sends, built without I/O (shared with echomq.aio.Queue)
        self.planner = AdmitPlanner(self.name, self.settings)
        self.keys = self.planner.keys
        self._waiters = None
        if redis is not None:
            self.redis = redis
            self.where = describe(redis)
        else:
            url = redis_url or pools.default_url()
            self.redis = client_from_url(url)
            self.where = redact_url(url)
        self.cluster = is_cluster(self.redis)
        self._registered = False
        self._protocol_read = False  # the meta's protocol version was read and accepted

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, {self.where})"

    # --- admitting -----------------------------------------------------------

    def add(
        self,
        name: str,
        payload: Any = None,
        *,
        lane: str | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        job_id: str | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | float | None = None,
        timeout: float | None = None,
        dedup_s: float | None = None,
        priority: int = 0,
        tx: Any = None,
        after: Iterable[str] | None = None,
        on_dep_failure: str = "fail",
        expires: float | datetime | None = None,
        debounce: str | None = None,
        debounce_s: float | None = None,
        debounce_max_s: float | None = None,
    ) -> str:
        """Admit one job and return its id (the same id again for a repeated ``job_id``).

        ``tx``: a SQLAlchemy Connection or Session: the job is written into the outbox
        table in its transaction and admitted after it commits (never, on a rollback).

        ``timeout``: the job's time limit in seconds (overrides the consumer's job_timeout).
        ``dedup_s``: the id stays reserved that long after the job completes, whatever the
        completed retention. ``priority``: 0 to 9, higher first across the queue (lanes
        stay round-robin within one priority); ValueError otherwise, nothing admitted.
        ``after``: ids of jobs of this queue this one waits for (state ``blocked`` until
        every one completed; ``on_dep_failure`` "fail": dead when one dies or is cancelled,
        "run": runs anyway); UnknownDependency for an id that does not exist, nothing
        admitted. See docs/workflows.md.
        ``expires``: seconds or an aware datetime; not started by then, the job never
        runs (state ``cancelled``, error "expired"). ``debounce``: see docs/control.md.
        ``tx``, ``after``, ``expires`` and ``debounce`` do not combine (ValueError, or
        InvalidSchedule for ``expires`` with ``debounce``; nothing admitted).
        """
        debounced = debounce is not None or debounce_s is not None or debounce_max_s is not None
        refuse_mixed(tx is not None, after is not None or on_dep_failure != "fail",
                     expires is not None, debounced)
        with producer_span(self.name, "add") as span:
            if debounced:  # at once, even in a deferring transaction: the server picks the id
                if self._hooks is not None:
                    self._hooks.before_add(self.name, None, name, payload)
                # a debounced job is a deferred one: "sync" and "durable" keep it on the floor
                keep = self.must_floor() or self.floor_sync(self._dial())
                jid = debouncing.add(self, name, payload, debounce, debounce_s, debounce_max_s,
                                     lane=lane, delay=delay, run_at=run_at, job_id=job_id,
                                     max_attempts=max_attempts, backoff=backoff,
                                     timeout=timeout, dedup_s=dedup_s, priority=priority,
                                     expires=expires)
                if keep:  # its row rewritten by every add it gathers
                    self._write_current(jid)
                note_message_id(span, jid)
                return jid
            until = None if expires is None else expiry.expires_arg(expires)
            spec = self.planner.spec(name, payload, lane, delay, run_at, job_id, max_attempts,
                                     backoff, timeout, dedup_s, priority)
            if self._hooks is not None:
                self._hooks.before_add(self.name, spec[0], name, payload)
            note_message_id(span, spec[0])
            if tx is not None:
                durable.to_outbox(tx, self.name, [spec])
                return spec[0]
            plain = until is None and after is None and on_dep_failure == "fail"
            # a framework's transaction (echomq.deferral); its rows' writer noted their tokens
            if plain and deferral.outboxer is not None and deferral.outboxed(self.name, [spec]):
                return spec[0]
            deps = None
            if after is not None or on_dep_failure != "fail":
                deps = [(depend.dependencies([] if after is None else after, on_dep_failure),
                         on_dep_failure)]

            def send() -> None:
                if deps is None:
                    self.admit([spec], until)
                else:
                    self.add_blocked([spec], deps)

            # a framework's deferrer (echomq.deferral) may take it to run at its commit
            if deferral.deferrer is None or not deferral.deferred(send):
                send()
        return spec[0]

    def add_many(self, jobs: Iterable[Sequence[Any] | Mapping[str, Any]], *,
                 tx: Any = None) -> list[str]:
        """Admit many jobs in one round trip; each is ``(name, payload)``,
        ``(name, payload, options)`` or a mapping of :meth:`add`'s arguments.

        Every job is validated before anything is sent, so a bad one admits none.
        ``tx``: as for :meth:`add`, all of them in that transaction. A job's ``expires``
        option is :meth:`add`'s (not with ``tx`` or dependencies in the same call).
        """
        jobs, deps = depend.split(jobs)  # (echomq.depend)
        with producer_span(self.name, "add_many", len(jobs)):
            expiries: dict[int, int] = {}
            specs = self.planner.specs(jobs, expiries)
            blocked = any(d is not None for d in deps)
            if expiries:
                refuse_mixed(tx is not None, blocked, True)
            if self._hooks is not None:
                for job_id, name, payload in added(specs):
                    self._hooks.before_add(self.name, job_id, name, payload)
            if specs and tx is not None:
                refuse_mixed(tx=True, after=blocked)
                durable.to_outbox(tx, self.name, specs)
            elif specs:
                if not blocked and not expiries and deferral.outboxed(self.name, specs):
                    return [s[0] for s in specs]

                def send() -> None:
                    if blocked:
                        self.add_blocked(specs, deps)
                    else:
                        self.admit(specs, expiries=expiries)

                if not deferral.deferred(send):
                    send()
        return [s[0] for s in specs]

    def admit(self, specs: Sequence[Spec], until: int | None = None,
              expiries: Mapping[int, int] | None = None) -> None:
        """Send jobs validated by :meth:`specs` (what ``add_many`` does once they are);
        ``until``: the one job's expiry, ``expiries``: some jobs' expiries by their index
        in ``specs``, marked in the same transaction as their admit."""
        if not specs:
            return
        marks = dict(expiries or {})
        if until is not None:
            marks[0] = until
        sync = self._must_sync(specs)
        on_floor = self.must_floor()
        with translated(self.where):
            self.register()
            if marks:
                for group in self.planner.marked_calls(specs, marks):
                    scripts.execute_atomically(self.redis, group)
            elif len(calls := self.planner.calls(specs)) == 1:
                script, keys, args = calls[0]
                script(self.redis, keys, args)
            else:
                scripts.execute(self.redis, calls)
        self.after_admit(specs, sync, on_floor)

    def add_blocked(self, specs: Sequence[Spec],
                    deps: Sequence[tuple[list[str], str] | None]) -> list[str]:
        """Admit validated jobs, some with dependencies (``deps``, None for a job without),
        in one round trip; UnknownDependency admits none."""
        calls = depend.plan(self.keys, specs, deps, self.planner.calls)
        sync = self._must_sync(specs)
        on_floor = self.must_floor()
        with translated(self.where):
            self.register()
            try:
                if len(calls) == 1:
                    scripts.execute(self.redis, calls)
                else:  # whole before any of its jobs can run and end (retention included)
                    scripts.execute_atomically(self.redis, calls)
            except redis.exceptions.ResponseError as exc:
                raise depend.translate(exc) from None
        self.after_admit(specs, sync, on_floor, deps)
        return [s[0] for s in specs]

    def specs(self, jobs: Iterable[Sequence[Any] | Mapping[str, Any]]
              ) -> tuple[list[Spec], bool]:
        """Validate jobs given as :meth:`add_many` takes them (nothing is sent), and say
        whether deferred ones must reach the floor (see :meth:`after_admit`)."""
        specs = self.planner.specs(jobs)
        return specs, bool(specs) and self._must_sync(specs)

    def after_admit(self, specs: Sequence[Spec], floor_sync: bool,
                    every_job: bool = False,
                    deps: Sequence[tuple[list[str], str] | None] | None = None) -> None:
        """Durability "sync": the admits are on a replica (on a cluster) and deferred jobs
        on the floor (``floor_sync``, from :meth:`specs`); "durable" (``every_job``, from
        :meth:`must_floor`): every admitted job is on the floor, in one commit (``deps``:
        each job's dependencies, for :meth:`add_blocked`)."""
        self._replicate()
        if every_job:
            with translated(self.where):
                durable.write_admitted(self.redis, self.keys, self.floor, specs, deps)
        elif floor_sync:
            self._sync_to_floor(specs)

    def must_floor(self) -> bool:
        """True when the queue's dial (or this producer's own setting) is "durable": every
        job goes onto the floor. A producer without a floor then refuses before admitting.
        A producer with neither a floor nor a setting of its own does not read the dial
        for immediate jobs (one round trip an add): give every producer of a durable
        queue ``floor=`` (docs/durability.md)."""
        if self.floor is None and self.settings.durability is None:
            return False
        if not durable.is_durable(self._dial(), self.settings.durability):
            return False
        durable.require_floor(self.name, self.floor)
        return True

    def _replicate(self) -> None:
        """Durability "sync" on a cluster: ``WAIT 1`` on the queue's node, where it has a
        replica, so an acknowledged admit survives that node's failover. Raises
        NotReplicated when no replica confirmed within ``REPLICA_WAIT_MS``: the job may or
        may not survive one."""
        if not self.cluster or "sync" not in (self._dial(), self.settings.durability):
            return
        with translated(self.where):
            acked = wait_replicas(self.redis, self.keys.acks, 1, REPLICA_WAIT_MS)
        if acked == 0:
            raise NotReplicated(f"queue {self.name}: no replica confirmed the admit within "
                                f"{REPLICA_WAIT_MS} ms at {self.where}")

    def _dial(self) -> str | None:
        """The queue's durability dial: the one its supervisor recorded in the queue's meta,
        else this producer's own setting (None when neither says). The recorded dial is
        read at most every ``echomq.admit.DIAL_TTL_S`` per Queue, so deferred adds keep one
        round trip."""
        if self.dial_stale():
            with translated(self.where):
                self.note_dial(self.redis.hget(self.keys.meta, "durability"))
        return self.dial()

    def dial_stale(self) -> bool:
        """True when the recorded dial must be read again from the queue's meta (never
        read, or read over DIAL_TTL_S ago); :meth:`note_dial` records what was read."""
        return self.planner.dial_stale()

    def note_dial(self, recorded: bytes | str | None) -> None:
        """Remember the meta's ``durability`` field as just read (None: not recorded)."""
        self.planner.note_dial(recorded)

    def dial(self) -> str | None:
        """The dial as last read (see :meth:`_dial`), without reading it again."""
        return self.planner.dial()

    def _must_sync(self, specs: Sequence[Spec]) -> bool:
        """True when these jobs include deferred ones and the dial says "sync"; a producer
        without a floor then refuses before admitting anything, rather than downgrade."""
        if not has_deferred(specs):
            return False  # only deferred jobs go to the floor; the dial is not even read
        return self.floor_sync(self._dial())

    def floor_sync(self, dial: str | None) -> bool:
        """Whether deferred jobs must reach the floor before the admit returns, for a queue
        whose dial reads ``dial`` (this producer's own setting counts too). Shared by the
        sync and the asyncio producer.

        Raises:
            ConfigError: the dial says "sync" and this producer has no floor (the caller
                has admitted nothing yet).
        """
        return self.planner.floor_sync(dial, self.floor is not None)

    def register(self) -> None:
        """Add this queue to the registry ``echomq queues`` reads (once per Queue object)."""
        if not self._registered:
            protocol.claim(self.redis, self.keys)  # ProtocolMismatch before any write
            self._protocol_read = True
            self.redis.sadd(REGISTRY, self.name)
            self._registered = True

    def check_protocol(self) -> None:
        """At this Queue's first read: refuse (ProtocolMismatch) a queue whose meta records
        another MAJOR protocol version (docs/protocol.md); reads record nothing."""
        if not self._protocol_read:
            protocol.check(self.name, self.redis.hget(self.keys.meta, protocol.FIELD))
            self._protocol_read = True

    def _sync_to_floor(self, specs: Sequence[Spec]) -> None:
        """Durability "sync": deferred jobs are on the floor before add() returns."""
        from echomq.floor.writethrough import write_through

        with translated(self.where):
            write_through(self.redis, self.keys, self.floor, deferred_ids(specs))

    def _write_current(self, job_id: str) -> None:
        """A debounced job's row, as its hash now is (in any live state), on the floor
        when it returns; see :func:`echomq.floor.writethrough.write_current`."""
        from echomq.floor.writethrough import write_current

        with translated(self.where):
            write_current(self.redis, self.keys, self.floor, job_id)

    def encode_payload(self, payload: Any) -> str:
        """JSON-encode a payload within the size and depth limits; PayloadError otherwise."""
        return self.planner.encode_payload(payload)

    def calls(self, specs: Sequence[Spec]) -> list[Call]:
        """The script calls that admit validated jobs (see :meth:`specs`)."""
        return self.planner.calls(specs)

    # --- reading ------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        """The job with this id, or None when it does not exist (or was dropped by retention).

        A job spilled to the floor (``job.spilled``) is read from its stub in Valkey; with a
        floor (``Queue(floor=...)``) its payload and other fields come from its floor row."""
        validate_job_id(job_id)
        with translated(self.where):
            self.check_protocol()
            raw = self.redis.hgetall(self.keys.job(job_id))
        if not raw:
            return None
        if self.floor is None or raw.get(b"spilled", raw.get("spilled")) not in (b"1", "1"):
            return Job.from_hash(self.name, raw)  # decodes what it can, whatever the bytes
        h = {_str(k): _str(v) for k, v in raw.items()}  # a stub: written by spill.lua
        try:
            h = with_floor_fields(h, self.floor.rows(self.name, [job_id]))
        except FloorError:
            pass  # the floor is down: the stub is what can be shown
        return Job.from_hash(self.name, h)

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for the job's handler to return and give back its value.

        Returns at once for a finished job; otherwise parks on the job's doorbell (no
        polling). Raises JobFailed (``.error``) for a dead job, TimeoutError when
        ``timeout`` seconds pass first, JobNotFound for an unknown id. A job this Queue
        wrote with ``tx=`` is waited for across the outbox relay (its "relayed" doorbell).
        """
        with translated(self.where):
            self.check_protocol()
            if self._waiters is None:
                # on a cluster: the node owning the queue's slot, where its doorbells ring
                self._waiters = results.waiter_pool(node_client(self.redis, self.keys.prefix))
            if (self.name, job_id) in durable.OUTBOXED:
                timeout = durable.await_relay(self.redis, self.keys, self.name, job_id,
                                              timeout)
            return results.wait(self._waiters, self.keys, job_id, timeout)

    def counts(self) -> dict[str, int]:
        """Jobs per state. ``completed`` is a running total; ``dead`` and ``cancelled`` are
        the jobs kept in those states (until retried or purged)."""
        with translated(self.where):
            self.check_protocol()
            return self._counts_of(scripts.counts(self.redis, self.keys))

    def stats(self) -> dict[str, Any]:
        """Counts plus totals: retried, spilled (on the floor only), lanes with work, and
        ``paused``."""
        with translated(self.where):
            values = scripts.counts(self.redis, self.keys)
        out: dict[str, Any] = self._counts_of(values)
        out.update(retried=values[5], spilled=values[6], lanes=values[7],
                   paused=bool(values[9]))
        return out

    @staticmethod
    def _counts_of(values: Sequence[int]) -> dict[str, int]:
        return dict(zip(STATES, (*values[:5], values[8], values[10]), strict=True))

    def events(self, since: str = "0", block_s: float | None = 1.0) -> Iterator[Event]:
        """The queue's job events after stream id ``since`` ("0": every one kept; "$":
        only new ones), in order; once caught up, waits up to ``block_s`` for the next
        one and ends when none came (``block_s=None``: follows for ever). Each
        :class:`echomq.Event`'s ``id`` is the ``since`` to read on from."""
        return events.read(self.redis, self.keys, since, block_s)

    def set_events(self, enabled: bool, max_len: int | None = None) -> None:
        """Turn the event stream on or off (on by default), and cap it at ``max_len``
        entries (approximately; default 10,000); recorded in the queue's meta, so every
        producer and consumer of the queue follows it at once."""
        key, mapping = events.set_events(self.redis, self.keys, enabled, max_len)
        with translated(self.where):
            self.redis.hset(key, mapping=mapping)

    def is_paused(self) -> bool:
        """True while the queue is paused (admits go on, claims wait)."""
        with translated(self.where):
            return bool(self.redis.exists(self.keys.paused))

    def pause(self) -> bool:
        """Stop handing out jobs (admits go on, active jobs finish); False if already paused."""
        with translated(self.where):
            self.register()
            return scripts.pause(self.redis, self.keys)

    def resume(self) -> bool:
        """Hand out jobs again, waking parked consumers; False if it was not paused."""
        with translated(self.where):
            return scripts.resume(self.redis, self.keys)

    def cancel(self, job_id: str) -> bool:
        """Cancel a waiting, scheduled or active job (state ``cancelled``). An active job's
        handler is stopped (see docs/control.md) and its error reads "cancelled while
        running". False when the job is unknown or already finished.

        With a floor (``Queue(floor=...)``) the job's floor row is gone before this
        returns, so the cancel holds even if Valkey loses its data right after; without
        one, the supervisor's scheduler drops the row within a beat."""
        validate_job_id(job_id)
        with translated(self.where):
            code = scripts.cancel(self.redis, self.keys, job_id)
            if code is scripts.Cancelled.ACTIVE:
                code = scripts.Cancelled(stopping.stop(self.redis, self.keys, job_id))
            done = code is scripts.Cancelled.CANCELLED
            if done and self.floor is not None:
                rows = self.floor.rows(self.name, [job_id])
                if rows and self.redis.hget(self.keys.job(job_id), "spilled"):
                    scripts.BACKFILL(self.redis, [self.keys.cancelled],
                                     backfill_args(self.keys, rows))
                if rows:
                    self.floor.close_jobs(self.name, [job_id], None)
        return done

    def jobs(self, state: str, limit: int = 100) -> list[Job]:
        """Up to ``limit`` jobs in ``state`` (oldest first; waiting: lane by lane)."""
        return self.jobs_page(state, limit=limit)[0]

    def jobs_page(self, state: str, limit: int = 100, cursor: str = ""
                  ) -> tuple[list[Job], str]:
        """One page of :meth:`jobs` and the cursor of the next ("" at the end). Costs
        O(limit) however many jobs the state holds."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}: use one of {', '.join(STATES)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be an integer from 1 to 10000, got {limit!r}")
        if cursor and not re.fullmatch(r"\d+(:\d+){0,2}", cursor):
            raise ValueError(f"invalid cursor {cursor!r}")
        with translated(self.where):
            nxt, flat = scripts.jobs(self.redis, self.keys, state, cursor, limit)
        found = []
        for fields in flat:
            raw: dict[bytes, bytes] = dict(zip(fields[::2], fields[1::2], strict=True))
            try:
                found.append(Job.from_hash(self.name, raw, strict=False))
            except CorruptJob:  # a hash without its required fields: nothing to show
                continue
        return found, nxt

    def purge(self, state: str) -> int:
        """Delete every job in a finished state (completed, dead or cancelled); returns how
        many. Works in batches, so the server is never held for long."""
        if state not in PURGEABLE:
            raise ValueError(f"purge takes one of {', '.join(PURGEABLE)}, not {state!r}")
        total = 0
        with translated(self.where):
            while True:
                purged, remaining = scripts.purge(self.redis, self.keys, state, PURGE_BATCH)
                total += purged
                if not remaining or not purged:
                    return total

    def lanes(self, top: int = 10, scan: int = 10_000, heads: int = 1000) -> dict[str, Any]:
        """The lanes with the most waiting jobs (looking at up to ``scan`` lanes) and the
        age of the oldest job at the head of the first ``heads`` lanes of the ring."""
        with translated(self.where):
            total, scanned, oldest, now, busiest = scripts.survey(self.redis, self.keys,
                                                                  scan, top, heads)
        return {"lanes": total, "scanned": scanned, "busiest": busiest,
                "oldest_waiting_s": max(0.0, (now - oldest) / 1000) if oldest >= 0 else None}

    def dead(self, limit: int = 100) -> list[Job]:
        """The oldest dead jobs, with their last error and traceback."""
        with translated(self.where):
            ids = self.redis.zrange(self.keys.dead, 0, limit - 1)
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self.keys.job(job_id.decode()))
            hashes = pipe.execute()
        return [Job.from_hash(self.name, h, strict=False) for h in hashes if h]

    def retry_dead(self, job_ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """Re-admit dead jobs (the given ids, or the oldest ``limit``); returns how many."""
        ids = [validate_job_id(j) for j in job_ids] if job_ids is not None else []
        if job_ids is not None and not ids:
            return 0
        with translated(self.where):
            return scripts.retry_dead(self.redis, self.keys, ids, limit)

    # --- crons ------------------------------------------------------------

    def add_cron(self, key: str, expr: str, name: str, payload: Any = None,
                 lane: str | None = None, tz: str = "UTC") -> cron.Cron:
        """Admit a job ``name`` with ``payload`` on ``lane`` at every occurrence of the cron
        expression ``expr`` in time zone ``tz``, from now on; replaces the cron ``key``
        (re-added with the same ``expr`` and ``tz``, it keeps its last occurrence, so one
        that fell due and was not admitted yet still is).

        The supervisor's leader scheduler admits each occurrence once, as job
        ``cron:<key>:<due_ms>``. Kept in Valkey, and on this Queue's floor when it has
        one (else the scheduler writes it to its floor within a beat).

        Args:
            key: names the cron, 1-128 characters from [A-Za-z0-9._:-].
            expr: five fields (minute hour day month weekday), six (the sixth is
                seconds), or an alias such as ``@hourly``.
        Returns:
            The stored cron (see :meth:`crons`).
        Raises:
            InvalidSchedule: a bad expression or time zone; InvalidName: a bad key, name
            or lane; PayloadError; MissingExtra without croniter (``echomq[cron]``).
            Nothing is stored on any of these.
        """
        spec = self.cron_spec(key, expr, name, payload, lane, tz)
        with translated(self.where):
            self.register()
            _, last = scripts.CRON_SET(self.redis, cron.set_keys(self.keys),
                                       [spec.key, spec.encode()])
        if self.floor is not None:
            self.floor.put_crons(self.name, [(spec.key, spec.encode(), int(last))], None)
        return spec.public(int(last), cron.next_after(spec.expr, spec.tz, int(last)))

    def cron_spec(self, key: str, expr: str, name: str, payload: Any, lane: str | None,
                  tz: str) -> cron.CronSpec:
        """Validate a cron as :meth:`add_cron` takes it (nothing is sent)."""
        return self.planner.cron_spec(key, expr, name, payload, lane, tz)

    def remove_cron(self, key: str) -> bool:
        """Stop a cron (jobs it already admitted stay); False when there was none."""
        cron.validate_key(key)
        with translated(self.where):
            removed = bool(scripts.CRON_REMOVE(self.redis, cron.remove_keys(self.keys), [key]))
        if self.floor is not None:
            removed = bool(self.floor.drop_crons(self.name, [key])) or removed
        return removed

    def crons(self) -> list[cron.Cron]:
        """The queue's crons, by key: expression, job name, payload, lane, time zone, the
        last occurrence admitted and the next due (ms since the epoch)."""
        with translated(self.where):
            pipe = self.redis.pipeline(transaction=False)
            pipe.hgetall(self.keys.crons)
            pipe.hgetall(self.keys.cronlast)
            specs, lasts = pipe.execute()
        return cron.parse_listing(specs, lasts)

    def set_lane_limit(self, lane: str, max_active: int | None = None, rate: int | None = None,
                       per_s: float | None = None) -> None:
        """Limit one lane (``"*"``: the queue default for every lane without its own).

        Args:
            lane: a lane name, or ``"*"`` for the default.
            max_active: at most this many of the lane's jobs active at once (1: each job
                starts only after the one before it settled, strict lane order).
            rate: at most this many starts per ``per_s`` seconds (default 1 s).
            per_s: the rate window in seconds (from 0.001 to one day).

        All None clears the lane's own limits (the default applies again). A lane at its
        limit leaves the ring until one of its jobs ends or its rate window opens.

        Raises:
            InvalidName: a lane name that is not valid.
            ValueError: a limit that is not a positive integer, or a window out of range.
        """
        value = limit_value(max_active, rate, per_s)
        if lane != "*":
            validate_name(lane, "lane name")
        with translated(self.where):
            self.register()
            scripts.set_limit(self.redis, self.keys, lane, value)

    def lane_limits(self) -> dict[str, dict[str, Any]]:
        """Every recorded lane limit (``"*"``: the default) as
        ``{lane: {"max_active", "rate", "per_s"}}``, None for a part not set."""
        with translated(self.where):
            raw = self.redis.hgetall(self.keys.limits)
        out: dict[str, dict[str, Any]] = {}
        for field, value in raw.items():
            name = field.decode() if isinstance(field, bytes) else field
            if name == queuelimit.FIELD:
                continue  # the queue-wide limit: queue_limit()
            text = value.decode() if isinstance(value, bytes) else value
            parts = [None if p == "-" else int(p) for p in text.split()] + [None] * 3
            out[name] = {"max_active": parts[0], "rate": parts[1],
                         "per_s": parts[2] / 1000 if parts[2] is not None else None}
        return out

    def set_queue_limit(self, max_active: int | None = None, rate: int | None = None,
                        per_s: float | None = None) -> None:
        """Limit the whole queue, across every lane and consumer process: at most
        ``max_active`` jobs active at once, at most ``rate`` starts per ``per_s`` seconds
        (default 1 s). Lane limits hold too. All None clears it. ValueError (nothing
        changed) for a limit that is not an integer from 1 to 999,999,999 or a window out
        of 0.001 to 86400 s."""
        value = limit_value(max_active, rate, per_s)
        with translated(self.where):
            self.register()
            queuelimit.set_queue_limit(self.redis, self.keys, value)

    def queue_limit(self) -> dict[str, Any]:
        """The queue-wide limit as ``{"max_active", "rate", "per_s"}`` (None: not set)."""
        with translated(self.where):
            return queuelimit.read(self.redis, self.keys)

    @staticmethod
    def registered(client: redis.Redis) -> list[str]:
        """Names of the queues producers or supervisors have used on this server."""
        return sorted(m.decode() if isinstance(m, bytes) else m
                      for m in client.smembers(REGISTRY))

    def ping(self) -> None:
        """Raise ConnectionFailed unless the server answers."""
        with translated(self.where):
            self.redis.ping()

    def close(self) -> None:
        """Close this queue's connections, the result waiters' pool included."""
        self.redis.close()
        if self._waiters is not None:
            self._waiters.disconnect()


def with_floor_fields(stub: dict[str, str], rows: Sequence[Any]) -> dict[str, str]:
    """A spilled job's stub filled out with its floor row's fields (the stub's own win:
    its state, due time and marks are current)."""
    if not rows or rows[0].error is not None:
        return stub
    return {**{str(k): str(v) for k, v in rows[0].fields.items()}, **stub}


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def backfill_args(k: Keys, rows: Sequence[Any]) -> list[Any]:
    """ARGV of backfill.lua: the floor rows' fields, copied into cancelled spilled jobs."""
    args: list[Any] = [k.prefix]
    for row in rows:
        if row.error is None:
            args += [row.job_id, len(row.fields)]
            for key, value in row.fields.items():
                args += [key, value]
    return args


def limit_value(max_active: int | None, rate: int | None, per_s: float | None) -> str:
    """Lane limits as the limit script stores them: "max_active rate per_ms", "-" for a
    part not set, or "max_active" alone; "" when none is set."""
    for what, v in (("max_active", max_active), ("rate", rate)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not 1 <= v <= MAX_LIMIT):
            raise ValueError(f"{what} must be an integer from 1 to {MAX_LIMIT:,} or None, "
                             f"got {v!r}")
    if per_s is not None and rate is None:
        raise ValueError("per_s needs a rate")
    per_ms = None
    if rate is not None:
        window = 1.0 if per_s is None else per_s
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not (
                math.isfinite(window) and 0.001 <= window <= 86_400):
            raise ValueError(f"per_s must be a number of seconds from 0.001 to 86400, "
                             f"got {per_s!r}")
        per_ms = round(window * 1000)
    if max_active is None and rate is None:
        return ""
    if rate is None:
        return str(max_active)  # the common case: the claim reads it with one tonumber
    return " ".join("-" if v is None else str(v) for v in (max_active, rate, per_ms))
