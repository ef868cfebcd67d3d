"""A standalone consumer's ear on its queue's stop channel (see echomq.stopping).

A thread subscribed to ``emq:{q}:stops`` hears each job cancelled while running and, when
this consumer holds it, has the concurrent drain cancel its coroutine (or drop it, not
started). The wait is a blocking read on the subscription, bounded by one beat so a
stop is seen; a lost connection is subscribed again after a pause. Pub/sub keeps nothing
for a subscriber that is away, so once a new subscription is confirmed ``on_subscribed``
runs: the consumer checks every job it holds for a cancel it missed meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from echomq.backoff import retry_pause
from echomq.connection import UNAVAILABLE_ERRORS
from echomq.keys import Keys
from echomq.stopping import channel, decode_id

log = logging.getLogger("echomq.consumer")


class StopListener:
    """Calls ``on_cancel(job_id)`` for each job cancelled while running, until closed."""

    def __init__(self, client: redis.Redis, keys: Keys, on_cancel: Callable[[str], None],
                 wait_s: float, on_subscribed: Callable[[], None] | None = None) -> None:
        self.client = client
        self.channel = channel(keys)
        self.on_cancel = on_cancel
        self.on_subscribed = on_subscribed
        self.wait_s = wait_s
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="echomq-stops", daemon=True)

    def start(self) -> StopListener:
        """Start listening in a thread of its own."""
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop listening (within one wait) and join the thread."""
        self.closed.set()
        self.thread.join(timeout=self.wait_s + 1)

    def _run(self) -> None:
        failures = 0
        while not self.closed.is_set():
            pubsub: Any = None
            try:
                pubsub = self.client.pubsub()
                pubsub.subscribe(self.channel)
                self._confirmed(pubsub)
                failures = 0
                if self.on_subscribed is not None:
                    self.on_subscribed()  # the cancels published while nothing listened
                while not self.closed.is_set():
                    job_id = decode_id(pubsub.get_message(timeout=self.wait_s))
                    if job_id is not None:
                        self.on_cancel(job_id)
            except UNAVAILABLE_ERRORS as exc:
                failures += 1
                log.debug("stop channel %s: %s", self.channel, exc)
                self.closed.wait(retry_pause(failures, 5.0))  # no event says it is back
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001 - a dead connection may fail to close
                        pass

    def _confirmed(self, pubsub: Any) -> None:
        """Read until the server confirmed the subscription (a cancel after it is heard);
        a cancel heard meanwhile is acted on."""
        while not self.closed.is_set():
            message = pubsub.get_message(timeout=self.wait_s)
            if isinstance(message, dict) and message.get("type") == "subscribe":
                return
            job_id = decode_id(message)
            if job_id is not None:
                self.on_cancel(job_id)
