"""The stream of job events: the script changing a job's state appends the event in the
same call; on by default, capped, switched off in the queue's meta; read by q.events(),
aio.Queue.events() and ``echomq events``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis

import echomq
from echomq.lanes import Lanes


def _kinds(q: echomq.Queue, job_id: str) -> list[str]:
    return [ev.kind for ev in q.events(block_s=0) if ev.job_id == job_id]


def handler(job: echomq.Job) -> Any:
    p = job.payload
    if p.get("progress"):
        job.progress({"done": 50})
    if p.get("fail"):
        raise ValueError("boom")
    if p.get("fatal"):
        raise echomq.Fail("give up")
    return "ok"


def test_each_state_change_is_one_event_in_order(redis_url: str, queue_name: str,
                                                 r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ok = q.add("w", {"progress": True}, lane="a")
    flaky = q.add("w", {"fail": True}, max_attempts=2, backoff=0.001)
    fatal = q.add("w", {"fatal": True})
    later = q.add("w", {}, delay=3600)
    gone = q.add("w", {}, lane="b")
    assert q.cancel(gone)
    r.zadd(q.keys.schedule, {later: 0})  # due now
    echomq.Consumer(q, handler).run(burst=True)
    assert _kinds(q, ok) == ["added", "started", "progress", "completed"]
    assert _kinds(q, fatal) == ["added", "started", "dead"]
    assert _kinds(q, later) == ["added", "waiting", "started", "completed"]
    assert _kinds(q, gone) == ["added", "cancelled"]
    assert _kinds(q, flaky)[:3] == ["added", "started", "failed"]
    assert q.retry_dead([fatal]) == 1
    assert _kinds(q, fatal)[-1] == "retried"

    events = list(q.events(block_s=0))
    assert [e.id for e in events] == sorted(
        [e.id for e in events], key=lambda i: tuple(int(x) for x in i.split("-")))
    assert len({e.id for e in events}) == len(events)
    started = next(e for e in events if e.job_id == ok and e.kind == "started")
    assert (started.lane, started.attempt) == ("a", 1)
    added = next(e for e in events if e.job_id == later and e.kind == "added")
    assert int(added.data["due_ms"]) > 0
    progress = next(e for e in events if e.kind == "progress")
    assert json.loads(progress.data["progress"]) == {"done": 50}
    assert events[0].at.tzinfo is not None
    # read on from an id: only what came after it
    assert [e.id for e in q.events(since=events[-3].id, block_s=0)] == \
        [e.id for e in events[-2:]]


def test_released_and_stalled_jobs_have_their_events(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url, lease_ms=100)
    a, b = q.add("w", {}), q.add("w", {})
    lanes = Lanes(q.redis, q.keys, q.settings)
    [ca, cb] = lanes.claim(2)
    lanes.release([(ca.id, ca.token)], "unstarted")
    lanes.release([(cb.id, cb.token)], "stall")
    assert _kinds(q, a) == ["added", "started", "requeued"]
    assert _kinds(q, b) == ["added", "started", "stalled"]


def test_set_events_false_appends_nothing_and_true_again_resumes(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_events(False)
    assert r.hget(q.keys.meta, "events") == b"0"
    off = q.add("w", {})
    echomq.Consumer(q, handler).run(burst=True)
    assert r.xlen(q.keys.events) == 0 and q.get(off).state == "completed"  # type: ignore[union-attr]
    q.set_events(True)
    on = q.add("w", {})
    assert _kinds(q, on) == ["added"]


def test_the_stream_is_capped(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.set_events(True, max_len=300)
    for _ in range(5):
        q.add_many([("w", {}) for _ in range(400)])
    for _ in range(600):
        q.add("w", {})
    kept = list(q.events(block_s=0))
    # MAXLEN ~ trims whole nodes of entries: about the cap, never everything added
    assert 300 <= len(kept) < 1500
    assert r.xlen(q.keys.events) < 700


def test_one_entry_per_script_call(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("w", {}) for _ in range(50)])
    assert r.xlen(q.keys.events) == 1
    events = list(q.events(block_s=0))
    assert [e.job_id for e in events] == ids and {e.kind for e in events} == {"added"}
    # read on from the middle of an entry: the rest of it
    assert [e.job_id for e in q.events(since=events[9].id, block_s=0)] == ids[10:]


def test_bad_arguments_are_refused(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(ValueError):
        list(q.events(since="yesterday"))
    with pytest.raises(ValueError):
        list(q.events(block_s=-1))
    with pytest.raises(ValueError):
        q.set_events(True, max_len=0)
    with pytest.raises(ValueError):
        q.set_events("no")  # type: ignore[arg-type]
    assert r.hget(q.keys.meta, "events") is None


def test_a_reader_blocks_until_the_next_event(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("w", {})
    got: list[echomq.Event] = []
    reading = threading.Event()

    def read() -> None:
        reading.set()
        for ev in q.events(since="$", block_s=30):
            got.append(ev)
            return

    t = threading.Thread(target=read)
    t.start()
    reading.wait(5)
    # "$" is the stream's end when the XREAD arrives: the add comes once the server holds
    # the reader blocked (no event says so; its client list is looked at, 10 s at most)
    server = redis.Redis.from_url(redis_url)
    deadline, pause = time.monotonic() + 10, threading.Event()
    while not any(c.get("cmd") == "xread" and "b" in c.get("flags", "")
                  for c in server.client_list()):
        assert time.monotonic() < deadline, "the reader never blocked"
        pause.wait(0.01)
    jid = q.add("w", {})
    t.join(30)
    assert [(e.job_id, e.kind) for e in got] == [(jid, "added")]


def test_aio_events(redis_url: str, queue_name: str) -> None:
    async def main() -> list[tuple[str, str]]:
        aq = echomq.aio.Queue(queue_name, redis_url=redis_url)
        try:
            jid = await aq.add("w", {})
            await aq.cancel(jid)
            return [(e.job_id, e.kind) async for e in aq.events(block_s=0)]
        finally:
            await aq.close()

    seen = asyncio.run(main())
    assert [k for _, k in seen] == ["added", "cancelled"]


def test_cli_prints_events_as_json_lines(redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    jid = q.add("w", {})
    out = subprocess.run([sys.executable, "-m", "echomq.ops.cli", "--redis-url", redis_url,
                          "events", queue_name, "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    assert json.loads(line)["job_id"] == jid and json.loads(line)["kind"] == "added"
    text = subprocess.run([sys.executable, "-m", "echomq.ops.cli", "--redis-url", redis_url,
                           "events", queue_name], capture_output=True, text=True, timeout=60)
    assert "added" in text.stdout and jid in text.stdout


def test_a_cron_occurrence_is_added_once(redis_url: str, queue_name: str) -> None:
    from echomq import cron, scripts

    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_cron("k", "* * * * * *", "beat", {"n": 1}, lane="cl")
    (spec_text,) = q.redis.hvals(q.keys.crons)
    spec = cron.CronSpec.decode("k", spec_text)
    last = int(q.redis.hget(q.keys.cronlast, "k"))
    fire = [q.keys.prefix, "k", spec.rev, last + 1000]
    scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), fire)
    scripts.CRON_FIRE(q.redis, cron.fire_keys(q.keys), fire)  # a retried call: nothing
    assert [(e.kind, e.job_id, e.lane) for e in q.events(block_s=0)] == [
        ("added", cron.job_id("k", last + 1000), "cl")]
