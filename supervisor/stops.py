"""Cancels of running jobs, heard on the queues' stop channels.

stop.lua records a cancelled active job and publishes its id on ``emq:{q}:stops``; one
subscription here, its socket in the arbiter's selector, hears it with no polling. The
child holding the job is then told or ended:

- a job running in a thread (a sync handler) cannot be interrupted: the child is ended
  at once (SIGKILL) and respawned, and the other jobs it held go back uncharged, the path
  a time limit takes (``Child.cancelled`` makes the release uncharged);
- a job not started yet in a sequential consumer would run later: the same;
- otherwise (a coroutine, or a job a concurrent consumer buffered) the child is sent
  ``C`` and cancels the coroutines, and drops the jobs, whose tokens went stale.

A cancel published while the subscription was down (pub/sub keeps nothing for a
subscriber that is away) is caught up: once a new subscription is confirmed, the jobs the
children hold are looked up, and each one recorded ``cancelled`` meanwhile is acted on as
if its message had arrived. A later cancel is heard on the subscription.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
from typing import TYPE_CHECKING, Any

import redis
from echomq.supervisor import protocol
from echomq.supervisor.holdings import FINISHED, HELD, RUNNING
from echomq.supervisor.logs import event
from echomq.supervisor.signals import sever

from echomq.connection import UNAVAILABLE_ERRORS
from echomq.runner import Runner
from echomq.stopping import channel, decode_id

if TYPE_CHECKING:
    from echomq.supervisor.arbiter import Arbiter
    from echomq.supervisor.children import Child
    from echomq.supervisor.runtime import QueueRuntime

log = logging.getLogger("echomq.supervisor")
SELECTOR_TAG = "stops"
MAX_MESSAGES = 1000  # read per wake-up; more wait for the next turn of the loop
CONFIRM_S = 2.0  # the longest wait for the server to confirm a new subscription


class Stops:
    """The subscription to every queue's stop channel, and what a cancel does to a child."""

    def __init__(self, house: Arbiter) -> None:
        self.house = house
        self.pubsub: Any = None
        self.fd: int | None = None
        self.by_channel = {channel(rt.metronome.keys).encode(): rt
                           for rt in house.queues.values()}
        self._pooled: dict[str, bool] = {}
        self.unsupported = False

    def arm(self) -> None:
        """Subscribe (again, after a lost connection); its socket joins the selector."""
        if self.pubsub is not None or self.house.stopping:
            return
        if self.unsupported:
            return
        pubsub = None
        try:
            pubsub = self.house.client.pubsub()  # confirmations read by _confirmed
            pubsub.subscribe(*self.by_channel)
            sock = pubsub.connection._sock
            sock.fileno()
            heard = self._confirmed(pubsub)
            self.catch_up()
        except UNAVAILABLE_ERRORS as exc:
            if pubsub is not None:
                self._close(pubsub)  # the loop comes back within seconds and tries again
            log.debug("stop channels: cannot subscribe now: %s", exc)
            return
        except (AttributeError, TypeError) as exc:  # a client whose subscription has no socket
            self.unsupported = True
            log.warning("stop channels: cannot listen with this client (%s); a cancelled "
                        "job's handler runs to its end, its outcome refused", exc)
            return
        self.pubsub = pubsub
        self.fd = sock.fileno()
        self.house.selector.register(self.fd, selectors.EVENT_READ, SELECTOR_TAG)
        for message in heard:
            self._act(message)

    def _confirmed(self, pubsub: Any) -> list[Any]:
        """Wait (a blocking read) until the server confirmed every channel, so that a
        cancel recorded after it is heard; the messages that came meanwhile are returned."""
        left = set(self.by_channel)
        heard = []
        while left:
            message = pubsub.get_message(timeout=CONFIRM_S)
            if message is None:
                raise redis.exceptions.ConnectionError("the subscription was not confirmed")
            if message.get("type") == "subscribe":
                left.discard(message["channel"])
            else:
                heard.append(message)
        return heard

    def catch_up(self) -> None:
        """Act on the held jobs that were cancelled while nothing listened: a job recorded
        ``cancelled`` whose token is no longer the one its child holds."""
        for rt in self.house.queues.values():
            held = [h for child in rt.children for h in child.holdings.entries()
                    if h.state != FINISHED]
            if not held:
                continue
            pipe = self.house.client.pipeline(transaction=False)
            for h in held:
                pipe.hmget(rt.metronome.keys.job(h.job_id), "state", "token")
            for h, (state, token) in zip(held, pipe.execute(), strict=True):
                if state == b"cancelled" and token != h.token.encode():
                    self.cancelled(rt, h.job_id)

    def _act(self, message: Any) -> None:
        job_id = decode_id(message)
        rt = self.by_channel.get(message["channel"]) if job_id else None
        if rt is not None and job_id is not None:
            self.cancelled(rt, job_id)

    def on_readable(self) -> None:
        """Read what arrived and act on each cancelled job."""
        pubsub = self.pubsub
        if pubsub is None:
            return
        try:
            for _ in range(MAX_MESSAGES):
                message = pubsub.get_message(timeout=0.0)
                if message is None and not pubsub.connection.can_read(timeout=0):
                    break
                self._act(message)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("stop channels: subscription lost (%s); subscribing again", exc)
            self.drop()

    def cancelled(self, rt: QueueRuntime, job_id: str) -> None:
        """End the handler of a job cancelled while a child of ``rt`` holds it, or claimed
        it ahead (leased, its reply not read yet: it would run when read)."""
        known = False
        for child in rt.children:
            held = next((h for h in child.holdings.entries() if h.job_id == job_id), None)
            known = known or held is not None
            if held is None or held.state == FINISHED:
                continue
            if (held.state == RUNNING and held.in_thread) or (
                    held.state == HELD and not self.pooled(rt)):
                self.end(rt, child, job_id)
            else:
                child.send(protocol.CANCEL)
        if not known:
            self.claimed_ahead(rt, job_id)

    def claimed_ahead(self, rt: QueueRuntime, job_id: str) -> None:
        """A cancelled job no child holds: the child whose claims record names its last
        lease (stop.lua kept its token) claimed it ahead and will run it when it reads the
        reply; a sequential one is ended now (its jobs go back uncharged), a concurrent one
        told to drop it."""
        children = [c for c in rt.children if c.claimer]
        if not children:
            return
        keys = rt.metronome.keys
        try:
            pipe = self.house.client.pipeline(transaction=False)
            pipe.hget(keys.job(job_id), "stopped_token")
            for child in children:
                pipe.lrange(keys.claims(child.claimer), 0, -1)
            token, *records = pipe.execute()
        except UNAVAILABLE_ERRORS as exc:
            log.warning("queue %s: cannot look for job %s among claims: %s",
                        rt.spec.name, job_id, exc)
            return
        if not token:
            return
        pair = [job_id.encode(), token]
        for child, raw in zip(children, records, strict=True):
            if any(raw[i:i + 2] == pair for i in range(0, len(raw) - 1, 2)):
                if self.pooled(rt):
                    child.send(protocol.CANCEL)
                else:
                    self.end(rt, child, job_id)  # it would run once its reply is read

    def end(self, rt: QueueRuntime, child: Child, job_id: str) -> None:
        """Kill the child now; it respawns at once, its other jobs handed back uncharged."""
        if child.cancelled or child.timed_out:
            child.cancelled.add(job_id)
            return  # already being ended
        child.cancelled.add(job_id)
        child.respawn_now = True
        event(log, "cancel", "queue %s: job %s cancelled while consumer %d ran it; ending "
              "the process", rt.spec.name, job_id, child.pid, queue=rt.spec.name,
              pid=child.pid)
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def pooled(self, rt: QueueRuntime) -> bool:
        """True when the queue's children run a concurrent drain (they can drop a held job)."""
        name = rt.spec.name
        if name not in self._pooled:
            self._pooled[name] = rt.settings.concurrency > 1 or Runner(
                name, rt.handler, rt.settings).has_async()
        return self._pooled[name]

    def drop(self) -> None:
        """Forget the subscription (lost, or stopping); :meth:`arm` makes a new one."""
        if self.fd is not None:
            try:
                self.house.selector.unregister(self.fd)
            except (KeyError, ValueError):
                pass
            self.fd = None
        if self.pubsub is not None:
            self._close(self.pubsub)
            self.pubsub = None

    @staticmethod
    def _close(pubsub: Any) -> None:
        try:
            pubsub.close()
        except Exception:  # noqa: BLE001 - a dead connection may fail to close
            pass

    def forget_in_child(self) -> None:
        """In a forked child: drop the subscription's socket without closing it for the
        parent, and its connection, so the PubSub's destructor hands nothing back to a
        pool whose lock the fork may have copied as held."""
        if self.pubsub is not None and self.pubsub.connection is not None:
            sever(getattr(self.pubsub.connection, "_sock", None))
            self.pubsub.connection._sock = None
            self.pubsub.connection = None
            self.pubsub = None
