"""The scripts are the protocol: headers, key counts and return codes agree with Python."""

from __future__ import annotations

import re
from importlib import resources

import redis

from echomq import scripts
from echomq.scripts import Settled


def _header(source: str) -> str:
    assert source.startswith("--[["), "script must open with a --[[ header ]]"
    return source[: source.index("]]")]


def test_every_lua_file_has_a_wrapper() -> None:
    files = {p.name[:-4] for p in resources.files("echomq").joinpath("lua").iterdir()
             if p.name.endswith(".lua")}
    assert files == {s.name for s in scripts.ALL} | set(scripts.LIBRARIES)


def test_headers_declare_the_keys_each_wrapper_passes() -> None:
    for script in scripts.ALL:
        header = _header(script.source)
        for section in ("Input:", "Output:"):
            assert section in header, f"{script.name}.lua header lacks {section}"
        declared = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", header)}
        assert declared == set(range(1, script.num_keys + 1)), script.name
        used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", script.source[len(header):])}
        assert used <= declared, f"{script.name}.lua uses undeclared keys {used - declared}"


def test_settle_codes_match_the_enum() -> None:
    header = _header(scripts.SETTLE.source)
    codes = dict(re.findall(r"(\d) (stale token|completed|retrying|dead)", header))
    assert {int(k): v.split()[0].upper() for k, v in codes.items()} == {
        code.value: code.name for code in Settled}


def test_every_ring_is_capped_at_64() -> None:
    for script in scripts.ALL:
        body = script.source[len(_header(script.source)):]
        pushes = body.count("redis.call('LPUSH', KEYS[")
        wake_key = None
        for line in body.splitlines():
            m = re.search(r"redis.call\('LPUSH', (KEYS\[\d\]), '1'\)", line)
            if m:
                wake_key = m.group(1)
                assert f"redis.call('LTRIM', {wake_key}, 0, 63)" in body, script.name
        if pushes:
            assert wake_key is not None, f"{script.name}.lua pushes something else"


def test_noscript_is_reloaded(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    import echomq

    q = echomq.Queue(queue_name, redis_url=redis_url)
    r.script_flush()
    q.add("x", 1)  # single call: reloads
    r.script_flush()
    q.add_many([("x", 2), ("x", 3, {"delay": 5})])  # pipelined: reloads too
    assert q.counts()["waiting"] == 2 and q.counts()["scheduled"] == 1


def test_a_single_call_encodes_as_the_client_s_pipelined_calls_do(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """A client made with another encoding than UTF-8 keeps redis-py's packer for a single
    script call too: one add and an add_many of two calls store a name alike."""
    import echomq

    q = echomq.Queue(queue_name, redis=redis.Redis.from_url(redis_url, encoding="latin-1"))
    q.add("x")  # the script loaded: no NOSCRIPT, whose retry takes redis-py's own path
    one = q.add("café")
    many = q.add_many([("café", None), ("café", None, {"delay": 60})])
    stored = {r.hget(q.keys.job(j), "name") for j in (one, *many)}
    assert stored == {"café".encode("latin-1")}


def test_an_int_subclass_argument_is_sent_as_its_number(
        redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """hiredis refuses an ``int`` subclass: such an argument goes through redis-py's
    encoder, which sends its number, as before the packed call."""
    import echomq

    class Attempts(int):
        pass

    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x")  # the script loaded: no NOSCRIPT, whose retry takes redis-py's own path
    job_id = q.add("x", max_attempts=Attempts(4))
    assert r.hget(q.keys.job(job_id), "max_attempts") == b"4"
