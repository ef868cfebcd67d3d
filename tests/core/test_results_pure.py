"""The pure part of waiting for results, shared by the sync and asyncio waiters."""

from __future__ import annotations

import pytest

import echomq
from echomq import results


def test_a_completed_reply_gives_the_decoded_value() -> None:
    assert results.outcome("j", [b"completed", b'{"a":[1,2]}', b""]) == {"a": [1, 2]}
    assert results.outcome("j", ["completed", "", ""]) is None  # a handler that returned None
    assert results.outcome("j", [b"completed", b"not json", b""]) == "not json"


def test_a_dead_or_cancelled_reply_raises_job_failed_with_the_error() -> None:
    with pytest.raises(echomq.JobFailed) as info:
        results.outcome("j", [b"dead", b"", b"Traceback...\nKeyError: 'x'\n"])
    assert info.value.job_id == "j" and info.value.error.startswith("Traceback")
    assert str(info.value) == "job 'j' is dead: KeyError: 'x'"
    with pytest.raises(echomq.JobFailed, match="cancelled"):
        results.outcome("j", [b"cancelled", b"", b""])


def test_pending_and_missing_replies() -> None:
    assert results.outcome("j", [b"pending"]) is results.PENDING
    assert results.outcome("j", [b"missing", b"c"]) is None
    with pytest.raises(echomq.JobFailed):
        results.outcome("j", [b"missing", b"d"])
    with pytest.raises(echomq.JobNotFound):
        results.outcome("j", [b"missing", b""])


def test_the_client_keeps_the_deadline_and_the_server_a_later_fallback() -> None:
    command, read_timeout = results.block_args("emq:{q}:done:j", 0.25)
    assert command[:5] == ["BLMOVE", "emq:{q}:done:j", "emq:{q}:done:j", "LEFT", "LEFT"]
    assert read_timeout == 0.25 and command[5] == 1.25
    command, read_timeout = results.block_args("k", None)
    assert command[5] == results.SLICE_S and read_timeout > results.SLICE_S


@pytest.mark.parametrize("bad", [float("nan"), "5", True])
def test_bad_timeouts_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        results.check_timeout(bad)  # type: ignore[arg-type]


def test_a_negative_timeout_is_an_immediate_one_like_asyncio_wait_for() -> None:
    assert results.check_timeout(-1.0) == 0.0
