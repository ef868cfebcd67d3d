"""What a crash costs its slot: a child that died with its settle landed on the server but
its reply unread (a settle written behind a claim) got work done, so its slot respawns at
once; a child that died having settled nothing since its slot's last crash backs off. The
moment is built, not waited for: the child's table holds a job whose outcome the server
has already recorded."""

from __future__ import annotations

import socket
import time

import pytest
import redis
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.children import Child
from echomq.supervisor.holdings import Holdings
from echomq.supervisor.protocol import LineReader
from echomq.supervisor.settings import QueueSpec, Settings

import echomq
from echomq.lanes import Lanes, Outcome


@pytest.mark.parametrize("landed", [True, False])
def test_a_crash_after_a_settle_landed_unread_is_not_a_crash_loop(
        redis_url: str, queue_name: str, landed: bool) -> None:
    r = redis.Redis.from_url(redis_url)
    q = echomq.Queue(queue_name, redis=r, max_stalls=10)
    job_id = q.add("x", {})
    lanes = Lanes(r, q.keys, q.settings)
    [claimed] = lanes.claim(1)
    if landed:  # the settle the child wrote behind its next claim ran; it never read it
        lanes.settle([Outcome(job_id, claimed.token, "c")])
    arbiter = Arbiter(Settings(redis_url=redis_url, queues=(
        QueueSpec(queue_name, "json:dumps"),)))
    rt = arbiter.queues[queue_name]
    slot = rt.slots[0]
    slot.crashes = 1  # its slot crashed once already
    ours, theirs = socket.socketpair()
    holdings = Holdings(4)
    holdings.hold([(job_id, claimed.token)])
    holdings.start(job_id)
    holdings.finish(job_id)  # ran; its outcome went out, unread
    child = Child(queue=queue_name, slot=0, pid=0, sock=ours, reader=LineReader(ours.fileno()),
                  holdings=holdings, state="busy")
    slot.child = child
    try:
        theirs.close()
        arbiter.children.on_exit(child, 1 << 8)  # exited with 1: a crash
        assert slot.respawn_at is not None
        if landed:
            assert slot.crashes == 1, "a child that got work done counted as a crash loop"
            assert slot.respawn_at <= time.monotonic()
            assert q.get(job_id).state == "completed"  # type: ignore[union-attr]
        else:
            assert slot.crashes == 2 and slot.respawn_at > time.monotonic()
            assert q.get(job_id).state == "waiting"  # type: ignore[union-attr]
    finally:
        ours.close()
        rt.metronome.doorbell.reset()
        arbiter.client.close()
