"""Outbox rows the relay cannot admit as they are (written by hand, by another program,
damaged): each is set aside, dead with the reason and the row's text, and the rows
around it are relayed. One such row must never hold up the queue's outbox. Real SQLite
files, real PostgreSQL, a real Valkey."""

from __future__ import annotations

import json

import pytest
import redis
import sqlalchemy as sa
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.relay import Relay

import echomq
from echomq.floor import Floor
from echomq.floor.schema import outbox


def _insert(floor: Floor, queue: str, job_id: str, spec: str) -> None:
    with floor.engine.begin() as conn:
        conn.execute(sa.insert(outbox).values(queue=queue, job_id=job_id, spec=spec,
                                              created_ms=0))


def _outbox_rows(floor: Floor) -> int:
    with floor.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM emq_outbox")).scalar_one())


def _good_spec(job_id: str) -> dict:
    return {"args": [job_id, "x", "{}", "default", 3, 1, "", "", "", "", "0"], "due": None}


BAD = {
    "not-json": "{not json",
    "not-an-object": json.dumps([1, 2]),
    "no-args": json.dumps({"due": None}),
    "short-args": json.dumps({"args": ["bad-1", "x"], "due": None}),
    "another-id": json.dumps({**_good_spec("someone-else"), "due": None}),
    "bad-due": json.dumps({**_good_spec("bad-1"), "due": "soon"}),
    "far-due": json.dumps({**_good_spec("bad-1"), "due": 10**15}),
    "bad-lane": json.dumps({"args": ["bad-1", "x", "{}", "a lane", 3, 1, "", "", "", "",
                                     "0"], "due": None}),
    "null-arg": json.dumps({"args": ["bad-1", "x", None, "default", 3, 1, "", "", "", "",
                                     "0"], "due": None}),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_row_that_does_not_parse_is_set_aside_dead_and_the_others_are_relayed(
        floor: Floor, server: LocalRedis, bad: str) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obx", redis=client)
    with floor.engine.begin() as conn:
        before = q.add("x", {"n": 1}, tx=conn)
    _insert(floor, "obx", "bad-1", BAD[bad])
    with floor.engine.begin() as conn:
        after = q.add("x", {"n": 2}, tx=conn)
    relay = Relay("obx", client, floor.engine)
    assert relay.run() == 3 and relay.error == ""
    assert _outbox_rows(floor) == 0
    assert q.get(before).state == "waiting" and q.get(after).state == "waiting"
    dead = q.get("bad-1")
    assert dead is not None and dead.state == "dead"
    assert "outbox row" in (dead.error or "") and BAD[bad][:20] in (dead.error or "")
    assert q.counts()["waiting"] == 2


def test_a_bad_row_of_an_id_that_exists_leaves_that_job_alone(floor: Floor,
                                                              server: LocalRedis) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("oby", redis=client)
    jid = q.add("x", {"n": 1}, job_id="taken")
    _insert(floor, "oby", "taken", "{not json")
    relay = Relay("oby", client, floor.engine)
    assert relay.run() == 1 and _outbox_rows(floor) == 0
    assert q.get(jid).state == "waiting" and q.counts()["waiting"] == 1


def test_a_bad_row_whose_id_is_not_a_job_id_is_logged_whole_and_dropped(
        floor: Floor, server: LocalRedis, caplog: pytest.LogCaptureFixture) -> None:
    client = redis.Redis.from_url(server.url)
    q = echomq.Queue("obz", redis=client)
    _insert(floor, "obz", "", "{not json at all")
    with floor.engine.begin() as conn:
        good = q.add("x", {}, tx=conn)
    relay = Relay("obz", client, floor.engine)
    assert relay.run() == 2 and _outbox_rows(floor) == 0
    assert q.get(good).state == "waiting"
    assert any("{not json at all" in r.getMessage() for r in caplog.records)
