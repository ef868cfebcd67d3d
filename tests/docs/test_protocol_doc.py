"""docs/protocol.md against the code it describes: every script with its KEYS and ARGV
(from the scripts' headers), every job hash field a script writes, every key of a queue.

A failure lists exactly what the page does not document yet."""

from __future__ import annotations

import re
from pathlib import Path

from echomq import protocol
from echomq.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "echomq" / "lua"
DOC = ROOT / "docs" / "protocol.md"
HASH_CALLS = re.compile(r"redis\.call\(\s*'(HSET|HSETNX|HINCRBY|HDEL|HGET|HMGET|HEXISTS)'\s*,"
                        r"\s*(jk|KEYS\[\d+\])\s*,")
ALL_FIELDS = ("HDEL", "HMGET")  # every argument after the key is a field
# the Keys methods building per-job, per-lane and per-consumer keys, by the name documented
KEY_METHODS = {"ring_of": "ring<p>", "job": "job:<id>", "lane": "lane:<lane>",
               "starts": "starts:<lane>", "claims": "claims:<claimer>",
               "retired": "retired:<claimer>", "done": "done:<id>",
               "dedup": "dedup:<id>"}


def header(path: Path) -> str:
    """The leading ``--[[ ... ]]`` comment of a script."""
    text = path.read_text()
    assert text.startswith("--[["), f"{path.name} has no --[[ header ]]"
    return text[4:text.index("]]")]


def header_keys(text: str) -> list[tuple[str, str]]:
    """(``KEYS[i]``, key name) pairs of a header's Input section."""
    return [(f"KEYS[{i}]", name) for i, name in re.findall(r"KEYS\[(\d+)\]\s+([A-Za-z_]+)", text)]


def header_argv(text: str) -> list[str]:
    """The ``ARGV[...]`` markers of a header (``ARGV[1]``, ``ARGV[3..]``)."""
    return sorted(set(re.findall(r"ARGV\[\d+(?:\.\.)?\]", text)))


def split_args(text: str) -> list[str]:
    """The comma-separated arguments of a call whose text starts after its '(' (up to the
    matching ')'), strings and nested brackets respected."""
    args, depth, cur, quote, i = [], 0, "", None, 0
    while i < len(text):
        c = text[i]
        if quote:
            cur += c
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            cur += c
        elif c in "([{":
            depth += 1
            cur += c
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
            cur += c
        elif c == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    args.append(cur.strip())
    return args


def job_hash_fields() -> dict[str, set[str]]:
    """Field name -> the scripts using it, for every literal field a script sets, reads,
    increments or deletes on a job hash (named ``jk`` in a script, or a KEYS entry its
    header calls ``job``)."""
    fields: dict[str, set[str]] = {}
    for path in sorted(LUA.glob("*.lua")):
        text = path.read_text()
        job_keys = {marker for marker, name in header_keys(header(path)) if name == "job"}
        for m in HASH_CALLS.finditer(text):
            if m.group(2) != "jk" and m.group(2) not in job_keys:
                continue
            args = split_args(text[m.start() + len("redis.call("):])[2:]
            names = args if m.group(1) in ALL_FIELDS else (
                args[::2] if m.group(1) == "HSET" else args[:1])
            for arg in names:
                if re.fullmatch(r"'[a-z_]+'", arg):
                    fields.setdefault(arg[1:-1], set()).add(path.name)
    return fields


def doc_sections() -> dict[str, str]:
    """The page's ``#### <script>.lua`` sections by script name."""
    text = DOC.read_text()
    parts = re.split(r"^#### `?([a-z_]+)\.lua`?\s*$", text, flags=re.M)
    return {parts[i]: re.split(r"^##", parts[i + 1], flags=re.M)[0]
            for i in range(1, len(parts), 2)}


def doc_table_names(title: str) -> set[str]:
    """The first-column code names of the table under the ``## <title>`` heading."""
    text = DOC.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end > 0 else None]
    return set(re.findall(r"^\|\s*`([^`]+)`", body, flags=re.M))


def test_every_script_and_its_keys_and_argv_are_documented() -> None:
    sections = doc_sections()
    missing = []
    for path in sorted(LUA.glob("*.lua")):
        name = path.stem
        text = header(path)
        if name not in sections:
            missing.append(f"script {name}.lua (no '#### {name}.lua' section)")
            continue
        section = sections[name]
        for marker, key in header_keys(text):
            if not re.search(rf"`{re.escape(marker)}`\s*\|\s*`{key}`", section):
                missing.append(f"{name}.lua: {marker} {key} (a row '| `{marker}` | `{key}` |')")
        for marker in header_argv(text):
            if f"`{marker}`" not in section:
                missing.append(f"{name}.lua: {marker}")
        if "Reply" not in section:
            missing.append(f"{name}.lua: its reply (a 'Reply' paragraph)")
    extra = sorted(set(sections) - {p.stem for p in LUA.glob("*.lua")})
    assert not missing, "docs/protocol.md does not document:\n  " + "\n  ".join(missing)
    assert not extra, f"docs/protocol.md documents scripts that do not exist: {extra}"


def test_every_job_hash_field_a_script_uses_is_documented() -> None:
    documented = doc_table_names("The job hash")
    missing = {f: s for f, s in job_hash_fields().items() if f not in documented}
    assert not missing, "docs/protocol.md's job hash table lacks these fields:\n  " + "\n  ".join(
        f"{f} (used by {', '.join(sorted(s))})" for f, s in sorted(missing.items()))


def test_every_key_of_a_queue_is_documented() -> None:
    documented = doc_table_names("Keys")
    fixed = [s for s in Keys.__slots__ if s not in ("queue", "prefix")]
    keys = Keys("q")
    names = [getattr(keys, s)[len(keys.prefix):] for s in fixed] + list(KEY_METHODS.values())
    missing = [n for n in names if n not in documented]
    assert not missing, "docs/protocol.md's Keys table lacks: " + ", ".join(missing)


def test_the_page_states_the_protocol_version() -> None:
    assert f"Protocol version: **{protocol.PROTOCOL_VERSION}**" in DOC.read_text()


def test_the_parser_finds_the_fields_admit_writes() -> None:
    fields = job_hash_fields()
    for name in ("id", "name", "payload", "lane", "state", "max_attempts", "created_ms",
                 "timeout_ms", "trace", "priority"):
        assert "admit.lua" in fields.get(name, set()), name
