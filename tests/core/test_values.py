"""Values the consumer cannot take: refused at admit, or the failure of their job at run time.

A payload nested deeper than the depth limit is refused like an oversized one; one that
reaches a job hash anyway (written by another producer) fails its job dead with the
cause, as does anything else a payload, a handler or its result throws. Retry delays and
backoffs of any size give a bounded retry, never an exception out of the consumer.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import redis

import echomq
from echomq import bulk
from echomq.config import QueueSettings
from echomq.keys import Keys
from echomq.runner import retry_ms_of
from echomq.task import tasks_on


def _nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _keys_of(r: redis.Redis, queue: str) -> list[bytes]:
    return sorted(r.scan_iter(match=f"{Keys(queue).prefix}*"))


def _hash(r: redis.Redis, queue: str, job_id: str) -> dict[str, str]:
    raw = r.hgetall(Keys(queue).job(job_id))
    return {k.decode(): v.decode() for k, v in raw.items()}


# --- the depth limit at admit ------------------------------------------------------------

def test_payload_depth_counts_nested_containers_not_brackets_in_strings() -> None:
    import json

    from echomq.job import payload_depth

    assert payload_depth(b"1") == 0
    assert payload_depth(b'"[[["') == 0
    assert payload_depth(b"[]") == 1
    assert payload_depth(b'{"a":[1,{"b":[]}]}') == 4
    assert payload_depth(json.dumps(["[[[[", '\\"[[[[', {"]]]]": "{{{{"}, "\\", "\\\"",
                                     "\u00e9[", "\u00e9{\\"]).encode()) == 2
    assert payload_depth(b"[[],[[]],[]]") == 3
    for depth in (7, 8, 9, 30, 500):  # shallow siblings beside one deep branch
        text = json.dumps([[], {"a": [1]}, _nested(depth - 1), [[2]]], ensure_ascii=False)
        assert payload_depth(text.encode()) == depth, depth


def test_a_payload_nested_past_the_limit_is_refused_naming_the_limit(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.settings.max_payload_depth == 100
    with pytest.raises(echomq.PayloadError, match=r"101 levels deep, over the limit of 100 "
                                                  r"\(QueueSettings.max_payload_depth\)"):
        q.add("x", _nested(101))
    # deeper than Python can encode: the same clear error, not a RecursionError
    with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
        q.add("x", _nested(100_000))
    # brackets inside strings are text, not nesting
    q.add("x", {"text": "[" * 5000})
    r.delete(*_keys_of(r, queue_name))
    with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
        q.add_many([("x", 1), ("x", _nested(101)), ("x", 3)])
    with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
        q.add_cron("k", "* * * * *", "x", _nested(150))
    assert _keys_of(r, queue_name) == []
    job = q.get(q.add("x", _nested(100)))
    assert job is not None and job.payload == _nested(100)


def test_the_depth_limit_is_a_setting_with_bounds(redis_url: str, queue_name: str,
                                                  r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, max_payload_depth=3)
    with pytest.raises(echomq.PayloadError, match="4 levels deep, over the limit of 3"):
        q.add("x", [[[[1]]]])
    assert _keys_of(r, queue_name) == []
    q.add("x", [[[1]]])
    for bad in (0, 501, True, 2.5):
        with pytest.raises(echomq.ConfigError, match="max_payload_depth"):
            QueueSettings(max_payload_depth=bad)  # type: ignore[arg-type]


def test_every_way_in_refuses_a_payload_past_the_depth_limit(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    deep = _nested(120)
    aq = echomq.aio.Queue(queue_name, redis_url=redis_url)

    async def aio_admits() -> None:
        with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
            await aq.add("x", deep)
        with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
            await aq.add_many([("x", 1), ("x", deep)])
        await aq.close()

    asyncio.run(aio_admits())
    with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
        bulk.add_many({queue_name: [("x", 1)], f"{queue_name}-b": [("x", deep)]},
                      redis_url)
    echomq.configure(redis_url=redis_url)
    try:
        @echomq.task(queue=queue_name)
        def deep_task(value: Any) -> None:
            return None

        with pytest.raises(echomq.PayloadError, match="over the limit of 100"):
            deep_task.send(deep)
    finally:
        echomq.configure(redis_url=None)
    assert _keys_of(r, queue_name) == [] and _keys_of(r, f"{queue_name}-b") == []


# --- a payload the consumer cannot decode, at run time -----------------------------------

def _batch_with_a_payload_too_deep(q: echomq.Queue, r: redis.Redis, depth: int
                                   ) -> tuple[str, list[str]]:
    """Five jobs, the third's payload rewritten in its hash past what a decoder can take
    (as a producer in another language could write it)."""
    assert q.pause()
    ids = q.add_many([("x", i) for i in range(5)])
    r.hset(q.keys.job(ids[2]), "payload", "[" * depth + "]" * depth)
    q.resume()
    return ids[2], [i for n, i in enumerate(ids) if n != 2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("depth", [990, 100_000])
def test_a_payload_too_deep_to_decode_fails_its_job_dead_and_the_batch_runs_once(
        redis_url: str, queue_name: str, r: redis.Redis, concurrency: int,
        depth: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    deep, others = _batch_with_a_payload_too_deep(q, r, depth)
    runs: list[str] = []
    consumer = echomq.Consumer(queue_name, lambda job: runs.append(job.id),
                               redis_url=redis_url, concurrency=concurrency, claim_batch=8)
    consumer.run(burst=True)
    consumer.close()
    assert sorted(runs) == sorted(others)
    h = _hash(r, queue_name, deep)
    assert h["state"] == "dead", h
    assert "nested too deep to decode" in h["error"], h["error"]
    assert int(h.get("stalls", 0)) == 0
    assert q.counts()["completed"] == 4 and q.counts()["active"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_payload_that_is_not_utf8_fails_its_job_dead_and_the_batch_runs_once(
        redis_url: str, queue_name: str, r: redis.Redis, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.pause()
    ids = q.add_many([("x", i) for i in range(5)])
    r.hset(q.keys.job(ids[2]), "payload", b'"\xff\xfe"')  # bytes another producer wrote
    q.resume()
    with pytest.raises(echomq.CorruptJob, match="not UTF-8"):
        q.get(ids[2])
    [listed] = [j for j in q.jobs("waiting") if j.id == ids[2]]
    assert listed.payload == '"\ufffd\ufffd"'  # listings keep what they can show
    runs: list[str] = []
    consumer = echomq.Consumer(queue_name, lambda job: runs.append(job.id),
                               redis_url=redis_url, concurrency=concurrency, claim_batch=8)
    consumer.run(burst=True)
    consumer.close()
    assert sorted(runs) == sorted(i for n, i in enumerate(ids) if n != 2)
    h = r.hgetall(q.keys.job(ids[2]))
    assert h[b"state"] == b"dead", h
    assert b"not UTF-8" in h[b"error"], h[b"error"]
    assert q.counts()["completed"] == 4 and q.counts()["active"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_result_nested_too_deep_completes_its_job_with_a_note_instead(
        redis_url: str, queue_name: str, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", 150), ("x", 100_000), ("x", 3)])
    consumer = echomq.Consumer(queue_name, lambda job: _nested(job.payload),
                               redis_url=redis_url, concurrency=concurrency)
    assert consumer.run(burst=True) == 3
    consumer.close()
    for job_id in ids[:2]:
        job = q.get(job_id)
        assert job is not None and job.state == "completed", job
        assert job.result == "<result nested deeper than 100 levels not kept>"
    assert q.result(ids[2], timeout=1) == _nested(3)


class _Unshowable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_result_whose_repr_raises_completes_its_job_once_with_a_note(
        redis_url: str, queue_name: str, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None)
    runs: list[str] = []

    def handler(job: echomq.Job) -> _Unshowable:
        runs.append(job.id)
        return _Unshowable()

    consumer = echomq.Consumer(queue_name, handler, redis_url=redis_url,
                               concurrency=concurrency)
    assert consumer.run(burst=True) == 1
    consumer.close()
    assert runs == [job_id]
    assert q.result(job_id, timeout=1) == ("<result of type _Unshowable not kept: its repr "
                                           "raised RuntimeError>")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_whatever_a_handler_raises_is_its_jobs_failure(
        redis_url: str, queue_name: str, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("recursion", None, {"max_attempts": 1}),
                      ("overflow", None, {"max_attempts": 1}),
                      ("cancelled", None, {"max_attempts": 1}),
                      ("ok", None)])

    def recurse(n: int) -> int:
        return recurse(n + 1) + 1

    async def cancelled() -> None:
        raise asyncio.CancelledError

    handlers = {"recursion": lambda job: recurse(0),
                "overflow": lambda job: math.exp(1000),
                "cancelled": lambda job: cancelled(),  # a sync handler returning a coroutine
                "ok": lambda job: "fine"}
    consumer = echomq.Consumer(queue_name, handlers, redis_url=redis_url,
                               concurrency=concurrency)
    assert consumer.run(burst=True) == 4
    consumer.close()
    causes = ("RecursionError", "OverflowError", "CancelledError")
    for job_id, cause in zip(ids[:3], causes, strict=True):
        job = q.get(job_id)
        assert job is not None and job.state == "dead" and cause in (job.error or ""), job
    assert q.result(ids[3], timeout=1) == "fine"


class _Unprintable(Exception):
    """An exception whose str() raises (a broken __str__ in an application's error class)."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_an_exception_whose_str_raises_is_its_jobs_failure(
        redis_url: str, queue_name: str, concurrency: int,
        caplog: pytest.LogCaptureFixture) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("bad", None, {"max_attempts": 1}), ("ok", None)])

    def bad(job: echomq.Job) -> None:
        raise _Unprintable

    consumer = echomq.Consumer(queue_name, {"bad": bad, "ok": lambda job: "fine"},
                               redis_url=redis_url, concurrency=concurrency)
    with caplog.at_level("WARNING", logger="echomq.jobs"):
        assert consumer.run(burst=True) == 2
    consumer.close()
    assert any(ids[0] in rec.getMessage() and rec.getMessage().endswith("dead: _Unprintable")
               for rec in caplog.records), [rec.getMessage() for rec in caplog.records]
    job = q.get(ids[0])
    assert job is not None and job.state == "dead" and "_Unprintable" in (job.error or ""), job
    assert q.result(ids[1], timeout=1) == "fine"
    assert q.counts()["active"] == 0


def test_a_failure_log_line_escapes_a_lone_surrogate(
        redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    retried = q.add("bad", None, max_attempts=2)
    dead = q.add("bad", None, max_attempts=1)

    def bad(job: echomq.Job) -> None:
        raise ValueError("bad byte \udcff here")

    consumer = echomq.Consumer(queue_name, {"bad": bad}, redis_url=redis_url)
    with caplog.at_level("WARNING", logger="echomq.jobs"):
        assert consumer.run(burst=True) == 2
    consumer.close()
    records = [rec for rec in caplog.records if rec.name == "echomq.jobs"]
    for job_id in (retried, dead):
        assert any(job_id in rec.getMessage() and "bad byte \\udcff here" in rec.getMessage()
                   for rec in records), [rec.getMessage() for rec in records]
    assert any(rec.exc_text and "bad byte \\udcff here" in rec.exc_text for rec in records)
    for rec in records:  # a strict UTF-8 handler (a log file) can write every line
        rec.getMessage().encode("utf-8")
        (rec.exc_text or "").encode("utf-8")

class _LazyHandlers(Mapping[str, Callable[[echomq.Job], Any]]):
    """A registry that imports a job's handler on first use: an unknown name raises
    ImportError from ``get`` (a Mapping's ``get`` passes on all but KeyError)."""

    def __getitem__(self, name: str) -> Callable[[echomq.Job], Any]:
        if name == "ok":
            return lambda job: "fine"
        return importlib.import_module(name).handler  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        return iter(["ok"])

    def __len__(self) -> int:
        return 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_handler_lookup_that_raises_is_its_jobs_failure(
        redis_url: str, queue_name: str, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.pause()
    missing = q.add("no_such_module_here", None, max_attempts=1)
    ok = q.add("ok", None)
    q.resume()
    consumer = echomq.Consumer(queue_name, _LazyHandlers(), redis_url=redis_url,
                               concurrency=concurrency)
    assert consumer.run(burst=True) == 2
    consumer.close()
    job = q.get(missing)
    assert job is not None and job.state == "dead", job
    assert "ModuleNotFoundError" in (job.error or ""), job.error
    assert q.result(ok, timeout=1) == "fine"
    assert q.counts()["active"] == 0


def test_a_progress_nested_past_the_limit_is_refused(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None)
    errors: list[str] = []

    def handler(job: echomq.Job) -> None:
        try:
            job.progress(_nested(101))
        except echomq.PayloadError as exc:
            errors.append(str(exc))
        job.progress(_nested(100))

    echomq.Consumer(queue_name, handler, redis_url=redis_url).run(burst=True)
    assert len(errors) == 1 and "nested 101 levels deep, over the limit of 100" in errors[0]
    job = q.get(job_id)
    assert job is not None and job.progress == _nested(100)


def test_a_result_or_progress_too_deep_to_decode_is_read_back_as_its_text(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", None)
    echomq.Consumer(queue_name, lambda job: 1, redis_url=redis_url).run(burst=True)
    deep = "[" * 5000 + "]" * 5000
    r.hset(q.keys.job(job_id), mapping={"result": deep, "progress": deep})
    job = q.get(job_id)
    assert job is not None and job.result == deep and job.progress == deep
    assert q.result(job_id, timeout=1) == deep


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_time_limit_past_what_a_float_holds_is_no_limit(
        redis_url: str, queue_name: str, r: redis.Redis, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.pause()
    ids = q.add_many([("x", i) for i in range(3)])
    r.hset(q.keys.job(ids[1]), "timeout_ms", "9" * 400)  # another producer wrote it
    q.resume()
    job = q.get(ids[1])
    assert job is not None and job.timeout is None
    consumer = echomq.Consumer(queue_name, lambda job: job.payload, redis_url=redis_url,
                               concurrency=concurrency)
    assert consumer.run(burst=True) == 3
    consumer.close()
    assert [q.result(i, timeout=1) for i in ids] == [0, 1, 2]


# --- retry delays of any size ------------------------------------------------------------

@pytest.mark.parametrize("delay", [1e306, 4e9, float("inf"), float("nan"), -1])
def test_retry_refuses_a_delay_it_cannot_keep(delay: float) -> None:
    with pytest.raises(ValueError, match="Retry delay"):
        echomq.Retry(delay=delay)


@pytest.mark.parametrize("field", ["base", "factor", "max", "jitter"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_backoff_refuses_values_that_are_not_finite(field: str, value: float) -> None:
    with pytest.raises(echomq.ConfigError, match="backoff"):
        echomq.Backoff(**{field: value})


def test_a_computed_retry_delay_is_whole_ms_at_most_100_years() -> None:
    from echomq.backoff import MAX_DELAY_MS, delay_ms

    assert MAX_DELAY_MS == 100 * 365.25 * 86_400_000
    assert delay_ms(1.5) == 1500
    assert delay_ms(1e306) == MAX_DELAY_MS
    assert delay_ms(float("inf")) == MAX_DELAY_MS
    assert delay_ms(float("nan")) == 0 and delay_ms(-3) == 0
    settings = QueueSettings()
    rng = random.Random(1)
    # factor ** attempt past what a float holds: the backoff's max, not an OverflowError
    assert retry_ms_of(settings, 5000, echomq.Backoff(0.5, 2, 60, 0).encode(), rng) == 60_000
    assert retry_ms_of(settings, 5000, echomq.Backoff(0, 2, 60, 0).encode(), rng) == 0
    huge = echomq.Backoff(1, 10, 1e300, 0.2)
    ms = retry_ms_of(settings, 400, huge.encode(), rng)
    assert ms == MAX_DELAY_MS and isinstance(ms, int)
    # a hash written by another producer with a backoff no constructor takes: the queue's
    assert retry_ms_of(settings, 1, "1:2:inf:0", rng) == pytest.approx(1000, rel=0.21)
    assert retry_ms_of(settings, 1, "nan:2:60:0", rng) == pytest.approx(1000, rel=0.21)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_retry_or_backoff_past_any_bound_is_a_retry_not_a_crash(
        redis_url: str, queue_name: str, r: redis.Redis, concurrency: int) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert q.pause()
    huge = q.add("huge_retry", None, max_attempts=1)
    many = q.add("fails", None, max_attempts=10_000,
                 backoff=echomq.Backoff(base=0.5, factor=2, max=7, jitter=0))
    r.hset(q.keys.job(many), "attempts", 4999)  # 2 ** 5000 is past what a float holds
    ok = q.add("ok", None)
    q.resume()

    def huge_retry(job: echomq.Job) -> None:
        raise echomq.Retry(delay=1e306)

    def fails(job: echomq.Job) -> None:
        raise RuntimeError("again")

    consumer = echomq.Consumer(queue_name, {"huge_retry": huge_retry, "fails": fails,
                                            "ok": lambda job: "fine"},
                               redis_url=redis_url, concurrency=concurrency)
    assert consumer.run(burst=True) == 3
    consumer.close()
    job = q.get(huge)
    assert job is not None and job.state == "dead", job
    assert "Retry delay must be" in (job.error or "")
    job = q.get(many)
    assert job is not None and job.state == "scheduled" and job.attempts == 5000, job
    seconds, micros = r.time()
    assert job.due_ms is not None
    assert 0 < job.due_ms - (seconds * 1000 + micros // 1000) <= 7_001  # the backoff's max
    assert q.result(ok, timeout=1) == "fine"
    assert q.counts()["active"] == 0


def test_the_tasks_of_a_queue_run_with_a_payload_too_deep_among_them(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    echomq.configure(redis_url=redis_url)
    try:
        @echomq.task(queue=queue_name)
        def echo(value: Any) -> Any:
            return value

        q = echomq.Queue(queue_name, redis_url=redis_url)
        assert q.pause()
        ids = [echo.send(i) for i in range(3)]
        r.hset(q.keys.job(ids[1]), "payload", '{"args":' + "[" * 2000 + "]" * 2000 + "}")
        q.resume()
        consumer = echomq.Consumer(queue_name, tasks_on(queue_name), redis_url=redis_url)
        consumer.run(burst=True)
        consumer.close()
        assert [q.result(ids[0], timeout=1), q.result(ids[2], timeout=1)] == [0, 2]
        h = _hash(r, queue_name, ids[1])
        assert h["state"] == "dead" and "nested too deep to decode" in h["error"]
    finally:
        echomq.configure(redis_url=None)
