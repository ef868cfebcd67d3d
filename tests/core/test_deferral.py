"""echomq.deferral: an installed deferrer holds add/add_many/task.send back until it runs them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import echomq
from echomq import deferral


@pytest.fixture
def held() -> Iterator[list[Callable[[], None]]]:
    taken: list[Callable[[], None]] = []

    def take(admit: Callable[[], None]) -> bool:
        taken.append(admit)
        return True

    previous = deferral.set_deferrer(take)
    yield taken
    deferral.set_deferrer(previous)


def test_adds_wait_for_the_deferrer_and_keep_their_ids(
        held: list[Callable[[], None]], redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    one = q.add("a", 1)
    many = q.add_many([("b", 2), ("c", 3, {"delay": 60})])
    assert q.get(one) is None and all(q.get(j) is None for j in many)
    assert len(held) == 2
    for admit in held:
        admit()
    assert q.get(one).state == "waiting"  # type: ignore[union-attr]
    assert [q.get(j).state for j in many] == ["waiting", "scheduled"]  # type: ignore[union-attr]


def test_a_declining_deferrer_admits_at_once(redis_url: str, queue_name: str) -> None:
    previous = deferral.set_deferrer(lambda admit: False)
    try:
        q = echomq.Queue(queue_name, redis_url=redis_url)
        assert q.get(q.add("a", 1)) is not None
    finally:
        deferral.set_deferrer(previous)


def test_bad_input_is_refused_before_anything_is_deferred(
        held: list[Callable[[], None]], redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    with pytest.raises(echomq.PayloadError):
        q.add("a", object())
    assert held == []
