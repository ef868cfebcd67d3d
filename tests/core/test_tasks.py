"""Tasks: registration, send/options, lanes from arguments, the process-wide pool, running."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator

import pytest
import redis

import echomq
from echomq import pools
from echomq.task import REGISTRY, tasks_on


@pytest.fixture
def configured(redis_url: str) -> Iterator[str]:
    echomq.configure(redis_url=redis_url)
    yield redis_url
    echomq.configure(redis_url=None)


@pytest.fixture
def consumer(redis_url: str) -> Iterator[list[echomq.Consumer]]:
    running: list[echomq.Consumer] = []
    yield running
    for c in running:
        c.stop()


def _run(running: list[echomq.Consumer], queue: str, url: str) -> None:
    c = echomq.Consumer(queue, tasks_on(queue), redis_url=url, beat_ms=200)
    threading.Thread(target=c.run, daemon=True).start()
    running.append(c)


def _hash(r: redis.Redis, queue: str, jid: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(f"emq:{{{queue}}}:job:{jid}").items()}


def test_send_admits_args_and_kwargs_under_the_task_name(configured: str, queue_name: str,
                                                         r: redis.Redis) -> None:
    @echomq.task(queue=queue_name, max_attempts=5, backoff=2.0, timeout=30.0)
    def send_email(to: str, subject: str = "") -> dict[str, str]:
        return {"to": to, "subject": subject}

    assert send_email("a@b.c", subject="direct") == {"to": "a@b.c", "subject": "direct"}
    jid = send_email.send("a@b.c", subject="hi")
    h = _hash(r, queue_name, jid)
    assert h["name"] == f"{__name__}.test_send_admits_args_and_kwargs_under_the_task_name." \
                        "<locals>.send_email"
    assert json.loads(h["payload"]) == {"args": ["a@b.c"], "kwargs": {"subject": "hi"}}
    assert (h["max_attempts"], h["timeout_ms"], h["lane"]) == ("5", "30000", "default")
    assert h["backoff"].startswith("2.0:")  # the task's backoff travels with the job


def test_options_override_per_call(configured: str, queue_name: str, r: redis.Redis) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.notify", timeout=30.0, lane="bulk")
    def notify(user: int) -> None: ...

    jid = notify.options(lane="user-7", job_id="mail-7", timeout=2.0, max_attempts=1).send(7)
    assert jid == "mail-7"
    h = _hash(r, queue_name, jid)
    assert (h["name"], h["lane"], h["timeout_ms"], h["max_attempts"]) == (
        f"{queue_name}.notify", "user-7", "2000", "1")
    later = notify.options(delay=60).send(8)
    assert _hash(r, queue_name, later)["state"] == "scheduled"
    assert _hash(r, queue_name, notify.send(9))["lane"] == "bulk"


def test_lane_is_a_function_of_the_arguments(configured: str, queue_name: str,
                                              r: redis.Redis) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.charge",
                 lane=lambda user_id, amount=0: f"user-{user_id}")
    def charge(user_id: int, amount: int = 0) -> None: ...

    lanes = [_hash(r, queue_name, charge.send(uid, amount=5))["lane"] for uid in (1, 2, 1)]
    assert lanes == ["user-1", "user-2", "user-1"]
    assert r.llen(f"emq:{{{queue_name}}}:lane:user-1") == 2
    # an explicit lane for one call wins over the function
    assert _hash(r, queue_name, charge.options(lane="vip").send(3))["lane"] == "vip"


def test_a_task_runs_by_name_and_its_result_comes_back(configured: str, queue_name: str,
                                                       consumer: list[echomq.Consumer]) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.add")
    def add(a: int, b: int) -> int:
        return a + b

    @echomq.task(queue=queue_name, name=f"{queue_name}.shout")
    def shout(word: str) -> str:
        return word.upper()

    _run(consumer, queue_name, configured)
    assert add.result(add.send(2, b=3), timeout=10) == 5
    assert shout.result(shout.send("hi"), timeout=10) == "HI"


def test_per_task_retries_then_dead_with_the_error(configured: str, queue_name: str,
                                                   consumer: list[echomq.Consumer]) -> None:
    calls = []

    @echomq.task(queue=queue_name, name=f"{queue_name}.flaky", max_attempts=2, backoff=0.01)
    def flaky(n: int) -> None:
        calls.append(n)
        raise RuntimeError(f"flaky {n} failed")

    _run(consumer, queue_name, configured)
    with pytest.raises(echomq.JobFailed) as info:
        flaky.result(flaky.send(1), timeout=10)
    assert "flaky 1 failed" in info.value.error and calls == [1, 1]


def test_an_unknown_task_name_goes_dead_with_a_clear_error(configured: str, queue_name: str,
                                                           consumer: list[echomq.Consumer]
                                                           ) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.known")
    def known() -> None: ...

    q = echomq.Queue(queue_name, redis_url=configured)
    jid = q.add("nobody.registered.this", {"args": [], "kwargs": {}})
    _run(consumer, queue_name, configured)
    with pytest.raises(echomq.JobFailed, match="unknown handler 'nobody.registered.this'"):
        q.result(jid, timeout=10)


def test_a_task_job_with_a_bad_payload_fails_saying_why(configured: str, queue_name: str,
                                                        consumer: list[echomq.Consumer]) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.strict")
    def strict(x: int) -> int:
        return x

    q = echomq.Queue(queue_name, redis_url=configured)
    jid = q.add(f"{queue_name}.strict", [1, 2], max_attempts=1)
    _run(consumer, queue_name, configured)
    with pytest.raises(echomq.JobFailed, match="payload must be"):
        q.result(jid, timeout=10)


def test_one_name_cannot_be_taken_by_two_functions(queue_name: str) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.dup")
    def first() -> None: ...

    with pytest.raises(ValueError, match="already registered"):
        @echomq.task(queue=queue_name, name=f"{queue_name}.dup")
        def second() -> None: ...

    assert REGISTRY[f"{queue_name}.dup"].fn is first.fn


def test_bad_task_options_are_refused_at_decoration(queue_name: str) -> None:
    with pytest.raises(echomq.InvalidName):
        echomq.task(queue="no spaces")(lambda: None)
    with pytest.raises(ValueError, match="max_attempts"):
        echomq.task(queue=queue_name, max_attempts=0)(lambda: None)
    with pytest.raises(ValueError, match="timeout"):
        echomq.task(queue=queue_name, timeout=-1)(lambda: None)


def test_send_goes_where_configure_or_the_environment_says(
        redis_url: str, queue_name: str, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.where")
    def where() -> None: ...

    echomq.configure(redis_url=None)
    monkeypatch.setenv("ECHOMQ_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    with pytest.raises(echomq.ConnectionFailed, match="127.0.0.1:1"):
        where.send()
    monkeypatch.setenv("ECHOMQ_REDIS_URL", redis_url)
    echomq.configure(redis_url=None)  # forget the clients made for the old URL
    assert r.exists(f"emq:{{{queue_name}}}:job:{where.send()}")
    echomq.configure(redis_url="redis://127.0.0.1:1/0")  # configure wins over the environment
    with pytest.raises(echomq.ConnectionFailed):
        where.send()
    where.redis_url = redis_url  # and a task's own URL wins over both
    assert r.exists(f"emq:{{{queue_name}}}:job:{where.send()}")
    echomq.configure(redis_url=None)


def test_one_pool_per_process_and_a_fresh_one_after_fork(configured: str, queue_name: str,
                                                         r: redis.Redis) -> None:
    @echomq.task(queue=queue_name, name=f"{queue_name}.forked")
    def forked(who: str) -> None: ...

    forked.send("parent")
    parent_client = pools.client()
    assert pools.client() is parent_client and pools.queue(queue_name).redis is parent_client
    pid = os.fork()
    if pid == 0:  # the child: a new client, its own sockets
        code = 1
        try:
            fresh = pools.client()
            forked.send("child")
            code = 0 if fresh is not parent_client and pools.client() is fresh else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    forked.send("parent again")  # the parent's pool is untouched by the child
    assert r.llen(f"emq:{{{queue_name}}}:lane:default") == 3
