"""Lanes.claim and settle: the consumer's two round trips, fused into one when possible."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from echomq import scripts
from echomq.config import QueueSettings
from echomq.connection import is_cluster
from echomq.job import Claimed, encode_json, parse_claimed
from echomq.keys import Keys
from echomq.scripts import Settled
from echomq.stopping import JobCancelled

MAX_PROGRESS_BYTES = 16 * 1024
MIN_POOL_AHEAD = 8  # the smallest connection pool a drain sends requests ahead on


@dataclass(frozen=True)
class Outcome:
    """How one leased job ended: outcome "c" completed, "f" failed, "d" dead at once."""

    job_id: str
    token: str
    outcome: str
    text: str = ""
    retry_ms: int = 0

    def args(self) -> list[Any]:
        """The outcome as the settle script's five ARGV values."""
        return [self.job_id, self.token, self.outcome, safe_text(self.text), self.retry_ms]


class Ahead:
    """A settle-and-claim written to the server whose reply is not read yet."""

    def __init__(self, in_flight: scripts.InFlight, outcomes: list[Outcome]) -> None:
        self.in_flight = in_flight
        self.outcomes = outcomes  # what its settle carries

    def read(self) -> tuple[list[Settled], list[Claimed]]:
        """The settle's codes (one per outcome) and the jobs claimed."""
        replies = self.in_flight.read()
        codes = scripts.settled_codes(replies[0]) if self.outcomes else []
        return codes, parse_claimed(replies[-1])

    def drop(self) -> None:
        """Give up on the reply (a request before this one failed): whether it ran is
        unknown, and the connection is dropped."""
        self.in_flight.drop()


def record_lane_limit(client: redis.Redis, keys: Keys, max_active: int) -> None:
    """Record the queue's default max_active per lane (``QueueSettings.lane_limit``,
    ``--lane-limit``), keeping a default rate recorded before; nothing when unchanged."""
    raw = client.hget(keys.limits, "*")
    text = raw.decode() if isinstance(raw, bytes) else raw
    rate = (text or "").split()[1:3]
    value = " ".join([str(max_active), *rate]) if rate else str(max_active)
    if value != text:
        scripts.set_limit(client, keys, "*", value)


def unheld_claims(raw: Sequence[bytes | str], held: set[tuple[str, str]]
                  ) -> list[tuple[str, str]]:
    """The (id, token) pairs of a claims record (claim.lua: a flat id, token list) for
    each job's newest claim, in claim order, unless that very pair is ``held``. A job held
    under an older token was claimed again unseen (its settle, a retry due at once, went
    out with the claim that took it back, and the reply was never read): the newer claim
    is not held."""
    def text(value: bytes | str) -> str:
        return value.decode() if isinstance(value, bytes) else value

    seen: set[str] = set()
    unheld = []
    for i in range(len(raw) - 2, -1, -2):  # newest first: an id's newest claim wins
        job_id = text(raw[i])
        if job_id not in seen and (job_id, token := text(raw[i + 1])) not in held:
            unheld.append((job_id, token))
        seen.add(job_id)
    return unheld[::-1]


def safe_text(text: str) -> bytes:
    """UTF-8 bytes of a handler's error or result; a lone surrogate (a file name decoded
    with surrogateescape) becomes a ``\\udcXX`` escape instead of failing the settle."""
    return text.encode("utf-8", "backslashreplace")


class Lanes:
    """Claims round-robin across lanes and settles with lease tokens, for one queue."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: QueueSettings) -> None:
        self.client = client
        self.keys = keys
        self.settings = settings
        self._claim_keys = scripts.claim_keys(keys)
        # a supervised consumer's name: its claims are recorded for the supervisor (claim.lua)
        self.claimer = ""
        self.claims_kept = 4 * max(settings.claim_batch, settings.concurrency)
        self._settle_keys = scripts.settle_keys(keys)
        keep_count, keep_age = settings.retention_args
        self._settle_head = [keys.prefix, keep_count, keep_age]

    def claim(self, count: int = 1, *, chain: bool = False) -> list[Claimed]:
        """Lease up to ``count`` waiting jobs, one lane per turn. With ``chain``, ring the
        doorbell when work remains, so the next parked consumer joins in."""
        return parse_claimed(scripts.CLAIM(self.client, self._claim_keys,
                                           self._claim_args(count, chain)))

    def settle(self, outcomes: Sequence[Outcome]) -> list[Settled]:
        """Settle finished jobs; a stale token comes back as Settled.STALE."""
        if not outcomes:
            return []
        codes = scripts.SETTLE(self.client, self._settle_keys, self._settle_args(outcomes))
        return scripts.settled_codes(codes)

    def settle_call(self, outcomes: Sequence[Outcome]
                    ) -> tuple[scripts.LuaScript, list[str], list[Any]]:
        """The settle script call for these outcomes (for a caller that does its own I/O)."""
        return scripts.SETTLE, self._settle_keys, self._settle_args(outcomes)

    def claim_call(self, count: int, chain: bool = False
                   ) -> tuple[scripts.LuaScript, list[str], list[Any]]:
        """The claim script call for up to ``count`` jobs (for a caller doing its own I/O)."""
        return scripts.CLAIM, self._claim_keys, self._claim_args(count, chain)

    def settle_and_claim(self, outcomes: Sequence[Outcome], count: int
                         ) -> tuple[list[Settled], list[Claimed]]:
        """Settle and claim the next batch in one round trip (a pipeline of two scripts)."""
        if not outcomes:
            return [], self.claim(count)
        codes, flat = scripts.execute(self.client, self._settle_and_claim_calls(outcomes, count))
        return scripts.settled_codes(codes), parse_claimed(flat)

    def _settle_and_claim_calls(self, outcomes: Sequence[Outcome], count: int
                                ) -> list[tuple[scripts.LuaScript, list[str], list[Any]]]:
        calls = [(scripts.CLAIM, self._claim_keys, self._claim_args(count))]
        if outcomes:
            calls.insert(0, (scripts.SETTLE, self._settle_keys, self._settle_args(outcomes)))
        return calls

    def can_send_ahead(self) -> bool:
        """True when :meth:`send_ahead` may be used: a plain server (not a cluster) whose
        pool has room for the connection a request sent ahead keeps for a batch beside
        those the heartbeat, an early settle and handlers (progress, adds) take."""
        if is_cluster(self.client):
            return False
        return getattr(self.client.connection_pool, "max_connections", 0) >= MIN_POOL_AHEAD

    def send_ahead(self, outcomes: Sequence[Outcome], count: int) -> Ahead:
        """Settle these outcomes and claim up to ``count`` more, without waiting: the
        request is written now and its reply read by :meth:`Ahead.read` later, so the
        server works while the consumer runs the jobs in hand."""
        return Ahead(scripts.send(self.client, self._settle_and_claim_calls(outcomes, count)),
                     list(outcomes))

    def send_behind(self, ahead: Ahead, outcomes: Sequence[Outcome], count: int) -> Ahead:
        """As :meth:`send_ahead`, written behind ``ahead`` before its reply is read (on its
        connection: the server runs the two in order)."""
        calls = self._settle_and_claim_calls(outcomes, count)
        return Ahead(ahead.in_flight.then(calls), list(outcomes))

    def release_unheld(self, held: set[tuple[str, str]]) -> int:
        """Hand back, uncharged, the jobs this consumer's claims leased that it does not
        hold (a claim whose reply was lost: the server ran it, the consumer saw an error).
        Call only with no claim under way. Returns how many went back."""
        if not self.claimer:
            return 0
        raw = self.client.lrange(self.keys.claims(self.claimer), 0, -1)
        requeued, _ = scripts.release(self.client, self.keys, unheld_claims(raw, held),
                                      "unstarted")
        return requeued

    def release(self, held: Sequence[tuple[str, str]], mode: str) -> tuple[int, int]:
        """Hand leased jobs back to their lanes (see reap.lua for the modes)."""
        return scripts.release(self.client, self.keys, held, mode)

    def release_call(self, held: Sequence[tuple[str, str]], mode: str
                     ) -> tuple[scripts.LuaScript, list[str], list[Any]]:
        """The release script call for these pairs (for a caller doing its own I/O)."""
        return scripts.release_call(self.keys, held, mode)

    def extend(self, held: Sequence[tuple[str, str]]) -> list[bool]:
        """Extend the leases of held (job id, token) pairs; one bool per pair, False if lost."""
        return scripts.extend(self.client, self.keys, self.settings.lease_ms, held)

    def progress(self, job_id: str, token: str, value: Any) -> bool:
        """Record a running job's progress and extend its lease; False when the lease is
        no longer this consumer's. Raises PayloadError for a value that is not small JSON
        (at most MAX_PROGRESS_BYTES, nested no deeper than a payload may be)."""
        text = encode_json(value, "progress", MAX_PROGRESS_BYTES,
                           self.settings.max_payload_depth,
                           depth_setting="QueueSettings.max_payload_depth")
        recorded = scripts.progress(self.client, self.keys, self.settings.lease_ms, job_id,
                                    token, text)
        if not recorded and self.client.hget(self.keys.job(job_id), "state") == b"cancelled":
            raise JobCancelled(job_id)  # ends the handler: the job was cancelled while running
        return recorded

    def dependency_results(self, job_id: str) -> dict[str, Any]:
        """{dependency id: result} of a job's completed dependencies (echomq.depend)."""
        from echomq.depend import read_results

        return read_results(self.client, self.keys, job_id)

    def rings_hold_lanes(self) -> bool:
        """True when the queue is not paused and a ring (of any priority) still holds a
        lane a claim has not judged yet: an empty claim that stopped after 1,000 lanes at
        their limit leaves the rest there, and the next claim goes on through them."""
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(self.keys.paused)
        pipe.llen(self.keys.ring)
        pipe.zrange(self.keys.prios, 0, -1)
        paused, plain, levels = pipe.execute()
        if paused:
            return False
        if plain or not levels:
            return bool(plain)
        pipe = self.client.pipeline(transaction=False)
        for p in levels:
            pipe.llen(self.keys.ring_of(int(p)))
        return any(pipe.execute())

    def _claim_args(self, count: int, chain: bool = False) -> list[Any]:
        args: list[Any] = [self.keys.prefix, self.settings.lease_ms, count,
                           "1" if chain else "0"]
        if self.claimer:
            args += [self.claimer, self.claims_kept]
        return args

    def _settle_args(self, outcomes: Sequence[Outcome]) -> list[Any]:
        args: list[Any] = [*self._settle_head, len(outcomes)]
        for o in outcomes:
            args += o.args()
        return args
