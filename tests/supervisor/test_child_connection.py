"""A failure confined to one consumer's own connection: the supervisor's connections stay
healthy, so it sees no outage and pokes nobody. The consumer must reconnect and finish
what it holds by itself: settle what finished, hand back uncharged what it never saw.

Connections go through a TCP proxy (proxy.py) that cuts the consumer's connection at a
chosen command: the supervisor sends neither claims nor settles, so a cut at one of those
is a cut of a consumer's connection.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
import redis

import echomq
from echomq import scripts

from .conftest import Supervisor, wait_until
from .proxy import Command, Proxy, script

Start = Callable[..., Supervisor]
MODES = [pytest.param([], id="plain"), pytest.param(["--concurrency", "4"], id="concurrent")]


@pytest.fixture
def proxy(redis_url: str) -> Iterator[Proxy]:
    """A proxy to the session's server."""
    target = urlsplit(redis_url)
    with Proxy(target.port or 6379, target.hostname or "127.0.0.1") as relay:
        yield relay


def _runs(r: redis.Redis, queue: str, job_id: str) -> int:
    started = r.lrange(f"ledger:{queue}:started", 0, -1)
    return sum(1 for x in started if x.decode().startswith(job_id + ":"))


def _start(supervisor: Start, proxy: Proxy, redis_url: str, queue: str, *args: str
           ) -> Supervisor:
    # its handlers write their ledger straight to the server, not through the proxy
    return supervisor(proxy.url, queue, "--processes", "1", "--lease-ms", "2000", *args,
                      env={"ECHOMQ_TEST_LEDGER_URL": redis_url}).started(1)


@pytest.mark.parametrize("mode", MODES)
def test_a_claim_whose_reply_a_consumer_lost_goes_back_uncharged_without_a_poke(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # the claim of a wake-up leases the job and its reply never arrives: the consumer saw
    # a network error, holds nothing, and no poke comes (the queue is quiet). The job must
    # go back uncharged and run, not wait out its lease and be reaped as a stall (with
    # max_stalls=0 that is dead without ever running)
    q = echomq.Queue(queue_name, redis=r, max_stalls=0)
    _start(supervisor, proxy, redis_url, queue_name, *mode)

    def claim_of_the_job(cmd: Command) -> bool:
        job = q.get("lost")
        return script(scripts.CLAIM)(cmd) and job is not None and job.state == "waiting"

    cut = proxy.cut(claim_of_the_job, when="after")
    q.add("x", {}, job_id="lost")
    assert cut.fired.wait(10), "no claim of the job went through the proxy"
    wait_until(lambda: q.get("lost").state in ("completed", "dead"),  # type: ignore[union-attr]
               20, "the job to end")
    job = q.get("lost")
    assert job is not None
    assert (job.state, job.stalls, _runs(r, queue_name, "lost")) == ("completed", 0, 1), (
        f"a job leased by a claim whose reply was lost was charged a stall: {job}")


@pytest.mark.parametrize("mode", MODES)
def test_a_settle_a_consumer_could_not_send_is_sent_again_without_a_poke(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # the job ran; its settle never reaches the server. On a quiet queue nothing pokes the
    # consumer again: it must reconnect and settle by itself, so result() returns
    q = echomq.Queue(queue_name, redis=r)
    _start(supervisor, proxy, redis_url, queue_name, *mode)
    cut = proxy.cut(script(scripts.SETTLE), when="before")
    job_id = q.add("x", {})
    assert cut.fired.wait(10), "no settle went through the proxy"
    assert q.result(job_id, timeout=10) == "ok"
    job = q.get(job_id)
    assert job is not None
    assert (job.state, job.stalls, _runs(r, queue_name, job_id)) == ("completed", 0, 1), job


@pytest.mark.parametrize("mode", MODES)
def test_a_consumer_whose_connection_is_cut_at_every_settle_keeps_retrying(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # several cuts in a row: the consumer backs off and tries again each time, and the job
    # settles once a settle gets through
    q = echomq.Queue(queue_name, redis=r)
    _start(supervisor, proxy, redis_url, queue_name, *mode)
    cuts = [proxy.cut(script(scripts.SETTLE), nth=n, when="before") for n in (1, 2, 3)]
    job_id = q.add("x", {})
    assert q.result(job_id, timeout=15) == "ok"
    assert all(c.fired.is_set() for c in cuts)
    job = q.get(job_id)
    assert job is not None and (job.state, job.stalls) == ("completed", 0), job
    assert _runs(r, queue_name, job_id) == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_stop_while_a_consumer_retries_a_settle_ends_with_the_job_settled(
        supervisor: Start, proxy: Proxy, redis_url: str, queue_name: str, r: redis.Redis,
        mode: list[str]) -> None:
    # the supervisor is told to stop while its consumer is backing off between failed
    # settles: the consumer stops retrying to drain, settles what it holds and exits
    q = echomq.Queue(queue_name, redis=r)
    sup = _start(supervisor, proxy, redis_url, queue_name, *mode)
    cuts = [proxy.cut(script(scripts.SETTLE), nth=n, when="before") for n in (1, 2, 3)]
    job_id = q.add("x", {})
    assert cuts[1].fired.wait(10), "the consumer did not try to settle again"
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    job = q.get(job_id)
    assert job is not None and (job.state, job.stalls) == ("completed", 0), job
    assert _runs(r, queue_name, job_id) == 1
