"""The randomized fault test's proxy observer reads the script calls consumers really send:
a claim names its claimer, a settle or a hand-back ends the holding it names (whatever
number of keys the scripts take). A misread settle used to raise on the proxy's relaying
thread, so that connection never got another reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

import echomq
from echomq import scripts
from echomq.lanes import Lanes, Outcome

from .proxy import Command, Link
from .test_fault_random import Holdings, Observed, Run


def _wire(call: tuple[scripts.LuaScript, list[str], list[Any]]) -> Command:
    """A script call as the proxy parses it off the wire: EVALSHA sha numkeys keys args."""
    script, keys, args = call
    return [str(part).encode() for part in ("EVALSHA", script.sha, len(keys), *keys, *args)]


def _reply(client: redis.Redis, cmd: Command) -> bytes:
    """The raw RESP reply the server gives ``cmd`` (run on a connection of its own)."""
    conn = client.connection_pool.make_connection()
    try:
        conn.connect()
        conn.send_packed_command(conn.pack_command(*cmd))
        parts = [conn._sock.recv(65536)]
        while not parts[-1].endswith(b"\r\n"):  # a reply this small comes in one piece
            parts.append(conn._sock.recv(65536))
        return b"".join(parts)
    finally:
        conn.disconnect()


def test_the_observer_reads_claims_settles_and_hand_backs(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    try:
        scripts.load_all(q.redis)
        q.add_many([("x", {}, {"job_id": f"{queue_name}-{i}"}) for i in range(2)])
        lanes = Lanes(q.redis, q.keys, q.settings)
        lanes.claimer = "child-7"
        holdings = Holdings(Run(seed=0, workdir=tmp_path))
        observer = Observed(holdings, None)
        link = Link(None, None, None)  # type: ignore[arg-type]  # only its tag is read

        claim = _wire(lanes.claim_call(2))
        observer.command(link, claim)
        assert link.tag == "child-7"
        observer.reply(link, claim, _reply(q.redis, claim), dropped=False)
        held = holdings.owner.copy()
        assert set(held) == {f"{queue_name}-0", f"{queue_name}-1"}
        assert {who for who, _, _ in held.values()} == {"child-7"}

        done, back = sorted(held)
        settle = _wire(lanes.settle_call([Outcome(done, held[done][1].decode(), "c")]))
        observer.reply(link, settle, b"*1\r\n:1\r\n", dropped=False)
        assert set(holdings.owner) == {back}

        release = _wire(scripts.release_call(q.keys, [(back, held[back][1].decode())],
                                             "unstarted"))
        observer.reply(link, release, b"*4\r\n:1\r\n:0\r\n:-1\r\n:0\r\n", dropped=False)
        assert holdings.owner == {}
    finally:
        q.close()
