"""The supervisor's hand-back of jobs a dead consumer leased but never held (its claims
record), when the server's reply to the supervisor is lost on the way."""

from __future__ import annotations

import socket
import threading

import redis
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.settings import QueueSpec, Settings

import echomq
from echomq.lanes import Lanes


class ReplyDropper:
    """A TCP relay to a real server that, once, forwards a request containing ``marker``
    and then closes the client's side without relaying the reply: the server has run
    the command, the client never learns it."""

    def __init__(self, target_port: int, marker: bytes) -> None:
        self.target_port = target_port
        self.marker = marker
        self.dropped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            self.socks += [client, server]
            muted = threading.Event()
            threading.Thread(target=self._up, args=(client, server, muted), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, muted),
                             daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, muted: threading.Event) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                return
            if not data:
                return
            drop = not self.dropped.is_set() and self.marker in data
            if drop:
                self.dropped.set()
                muted.set()  # before the request goes: its reply is never relayed
            server.sendall(data)
            if drop:
                client.shutdown(socket.SHUT_RDWR)
                client.close()
                return

    def _down(self, server: socket.socket, client: socket.socket,
              muted: threading.Event) -> None:
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                return
            if not data or muted.is_set():
                return
            try:
                client.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


def test_unheld_claims_go_back_uncharged_when_the_reply_to_reading_the_record_is_lost(
        private_redis: LocalRedis, queue_name: str) -> None:
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis=r)
    ids = q.add_many([("x", {"n": i}) for i in range(2)])
    # a consumer named "deadbeef" claimed both and died before it held them
    lanes = Lanes(r, q.keys, q.settings)
    lanes.claimer = "deadbeef"
    assert len(lanes.claim(2)) == 2
    relay = ReplyDropper(private_redis.port, b"claims:deadbeef")
    settings = Settings(redis_url=f"redis://127.0.0.1:{relay.port}/0", queues=(
        QueueSpec(queue_name, "echomq.supervisor.drills.handler:handle"),))
    arbiter = Arbiter(settings)
    rt = arbiter.queues[queue_name]
    try:
        arbiter.releases.release_claims(rt, "deadbeef", set())
        assert relay.dropped.is_set()
        arbiter.releases.retry(rt)  # what the next beat does with anything kept
        for job_id in ids:
            job = q.get(job_id)
            assert job is not None
            assert (job.state, job.attempts, job.stalls) == ("waiting", 0, 0), (
                "a job leased to a dead consumer stays leased until its lease expires, "
                f"then is charged a stall: {job}")
    finally:
        rt.metronome.doorbell.reset()
        arbiter.client.close()
        relay.close()


def test_a_job_claimed_again_unseen_under_a_newer_token_goes_back_uncharged(
        private_redis: LocalRedis, queue_name: str) -> None:
    """A consumer held X under its first token; X's settle (a failure, retried at once)
    landed, a promote put it back, and a claim of the same consumer took it again under
    a second token; the consumer died with both replies unread. The supervisor releases
    the held pair (no longer matching: it landed) and the record's newer claim, which the
    consumer never saw, goes back uncharged instead of waiting out its lease."""
    from echomq.supervisor.children import Child
    from echomq.supervisor.holdings import Holdings
    from echomq.supervisor.protocol import LineReader

    from echomq import scripts
    from echomq.lanes import Outcome

    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis=r, max_attempts=5)
    [job_id] = q.add_many([("x", {})])
    lanes = Lanes(r, q.keys, q.settings)
    lanes.claimer = "deadbeef"
    [first] = lanes.claim(1)
    assert lanes.settle([Outcome(job_id, first.token, "f", "boom", 0)])
    assert scripts.promote(r, q.keys, 100)[0] == 1
    [second] = lanes.claim(1)
    assert second.id == job_id and second.token != first.token
    settings = Settings(redis_url=private_redis.url, queues=(
        QueueSpec(queue_name, "echomq.supervisor.drills.handler:handle"),))
    arbiter = Arbiter(settings)
    rt = arbiter.queues[queue_name]
    ours, theirs = socket.socketpair()
    holdings = Holdings(4)
    holdings.hold([(job_id, first.token)])
    holdings.start(job_id)
    holdings.finish(job_id)
    child = Child(queue=queue_name, slot=0, pid=0, sock=ours, reader=LineReader(ours.fileno()),
                  holdings=holdings, claimer="deadbeef", state="busy")
    try:
        held, stalled, landed = arbiter.releases.release_child(rt, child)
        assert (held, stalled, landed) == (1, [], 1)
        job = q.get(job_id)
        assert job is not None
        assert (job.state, job.attempts, job.stalls) == ("waiting", 1, 0), (
            f"the claim the consumer never saw stays leased until it expires: {job}")
    finally:
        ours.close()
        theirs.close()
        rt.metronome.doorbell.reset()
        arbiter.client.close()
