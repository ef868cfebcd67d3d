"""Every key a queue's scripts and commands touch lives in that queue's one slot."""

from __future__ import annotations

import re
from importlib import resources

from echomq import scripts
from echomq.connection import slot_of
from echomq.keys import Keys


def test_every_fixed_key_of_a_queue_shares_its_slot() -> None:
    k = Keys("emails")
    names = [getattr(k, a) for a in Keys.__slots__ if a not in ("queue", "prefix")]
    names += [k.job("j1"), k.lane("player-42")]
    assert all(n.startswith("emq:{emails}:") for n in names)
    assert {slot_of(n) for n in names} == {slot_of(k.prefix)}


def test_every_script_call_declares_keys_of_one_queue() -> None:
    k = Keys("emails")
    for keys in (scripts.admit_keys(k), scripts.schedule_keys(k), scripts.claim_keys(k),
                 scripts.settle_keys(k), scripts.reap_keys(k)):
        assert {slot_of(x) for x in keys} == {slot_of(k.prefix)}


def test_scripts_build_other_keys_only_from_the_queue_prefix() -> None:
    """Keys a script touches beyond KEYS are built from ARGV[1] (the ``emq:{q}:`` prefix);
    no script names a key of its own (a literal ``emq:`` or another hash tag)."""
    for script in scripts.ALL:
        source = resources.files("echomq").joinpath("lua", f"{script.name}.lua").read_text()
        body = source.split("]]", 1)[1]  # after the header comment
        assert "emq:" not in body, script.name
        literals = re.findall(r"'[^'\n]*'|\"[^\"\n]*\"", body)
        assert not [x for x in literals if "{" in x], script.name
