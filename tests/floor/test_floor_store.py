"""Floor reads and writes, fencing, restore and rehydration paging, on both backends."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from echomq.errors import StaleFence
from echomq.floor import Floor, FloorRow

Q = "emails"


def _rows(n: int, *, spilled: bool = False, due: int = 1000) -> list[FloorRow]:
    return [
        FloorRow(f"job-{i:05d}", due + i, {"name": "send", "n": str(i)}, spilled=spilled)
        for i in range(n)
    ]


def _all(floor: Floor, queue: str = Q) -> dict[str, FloorRow]:
    return {row.job_id: row for row in floor.open_rows(queue, None, 1_000_000)}


def test_upsert_is_idempotent_and_updates(floor: Floor) -> None:
    row = FloorRow("a", 100, {"payload": '{"to": "x"}', "état": "ü"})
    assert floor.upsert(Q, [row], fence=1) == 1
    assert floor.upsert(Q, [row], fence=1) == 1
    assert floor.count(Q) == 1
    assert _all(floor)["a"] == row

    moved = FloorRow("a", 200, {"attempts": "2"}, spilled=True)
    floor.upsert(Q, [moved], fence=1)
    assert floor.count(Q) == 1
    assert _all(floor)["a"] == moved


def test_upsert_repeated_id_in_one_batch_last_wins(floor: Floor) -> None:
    floor.upsert(Q, [FloorRow("a", 1, {"v": "1"}), FloorRow("a", 2, {"v": "2"})], fence=1)
    assert _all(floor) == {"a": FloorRow("a", 2, {"v": "2"})}


def test_queues_are_separate(floor: Floor) -> None:
    floor.upsert("one", [FloorRow("a", 1, {})], fence=1)
    floor.upsert("two", [FloorRow("a", 2, {})], fence=7)
    assert floor.count("one") == floor.count("two") == 1
    assert floor.close_jobs("one", ["a"], fence=1) == 1
    assert floor.count("two") == 1


def test_close_deletes_and_counts_existing(floor: Floor) -> None:
    floor.upsert(Q, _rows(5), fence=1)
    assert floor.close_jobs(Q, ["job-00000", "job-00001", "missing", "job-00001"], fence=1) == 2
    assert floor.count(Q) == 3
    assert "job-00000" not in _all(floor)
    assert floor.close_jobs(Q, [], fence=1) == 0


def test_mark_spilled_and_count(floor: Floor) -> None:
    floor.upsert(Q, _rows(10), fence=1)
    assert floor.mark_spilled(Q, ["job-00002", "job-00003", "nope"], fence=1) == 2
    assert floor.count(Q) == 10
    assert floor.count(Q, spilled=True) == 2
    assert floor.count(Q, spilled=False) == 8
    assert _all(floor)["job-00002"].spilled


def test_stale_fence_changes_nothing(floor: Floor) -> None:
    floor.upsert(Q, [FloorRow("a", 1, {"v": "old"}, spilled=True)], fence=5)
    before = _all(floor)

    with pytest.raises(StaleFence, match="fence 4 is stale"):
        floor.upsert(Q, [FloorRow("a", 9, {"v": "new"}), FloorRow("b", 1, {})], fence=4)
    with pytest.raises(StaleFence):
        floor.close_jobs(Q, ["a"], fence=4)
    with pytest.raises(StaleFence):
        floor.mark_spilled(Q, ["a"], fence=4)
    applied: list[list[FloorRow]] = []
    with pytest.raises(StaleFence):
        floor.restore_due(Q, 10**15, 10, fence=4, apply=applied.append)
    assert applied == []
    assert _all(floor) == before

    # Same fence and newer fences still write; afterwards the old one is stale too.
    floor.upsert(Q, [FloorRow("b", 1, {})], fence=5)
    floor.upsert(Q, [FloorRow("c", 1, {})], fence=6)
    with pytest.raises(StaleFence):
        floor.upsert(Q, [FloorRow("d", 1, {})], fence=5)
    assert sorted(_all(floor)) == ["a", "b", "c"]


def test_fences_are_per_queue(floor: Floor) -> None:
    floor.upsert("one", [FloorRow("a", 1, {})], fence=10)
    # queue "two" has its own fence: a low one still writes there ...
    floor.upsert("two", [FloorRow("a", 1, {"q": "2"})], fence=1)
    assert _all(floor, "two")["a"].fields == {"q": "2"}
    # ... and does not lower queue "one"'s fence
    with pytest.raises(StaleFence):
        floor.upsert("one", [FloorRow("b", 1, {})], fence=9)
    assert sorted(_all(floor, "one")) == ["a"]


def test_restore_due_in_order_only_spilled(floor: Floor) -> None:
    floor.upsert(
        Q,
        [
            FloorRow("late", 300, {"k": "late"}, spilled=True),
            FloorRow("early", 100, {"k": "early"}, spilled=True),
            FloorRow("mid", 200, {"k": "mid"}, spilled=True),
            FloorRow("in-redis", 50, {"k": "in-redis"}, spilled=False),
            FloorRow("future", 400, {"k": "future"}, spilled=True),
        ],
        fence=1,
    )
    seen: list[list[FloorRow]] = []
    assert floor.restore_due(Q, until_ms=400, limit=2, fence=1, apply=seen.append) == 2
    assert [[r.job_id for r in batch] for batch in seen] == [["early", "mid"]]
    assert seen[0][0] == FloorRow("early", 100, {"k": "early"}, spilled=True)

    # until_ms is exclusive: "future" (due 400) stays on the floor.
    assert floor.restore_due(Q, until_ms=400, limit=10, fence=1, apply=seen.append) == 1
    assert [r.job_id for r in seen[1]] == ["late"]
    assert floor.restore_due(Q, until_ms=400, limit=10, fence=1, apply=seen.append) == 0
    assert len(seen) == 2  # apply is not called for nothing

    rows = _all(floor)
    assert [k for k, r in sorted(rows.items()) if r.spilled] == ["future"]
    assert floor.count(Q) == 5  # restored rows stay open until the job ends


def test_restore_due_rolls_back_when_apply_raises(floor: Floor) -> None:
    floor.upsert(Q, _rows(3, spilled=True), fence=1)

    def boom(rows: list[FloorRow]) -> None:
        raise ConnectionError("redis went away")

    with pytest.raises(ConnectionError, match="redis went away"):
        floor.restore_due(Q, until_ms=10**15, limit=10, fence=1, apply=boom)
    assert floor.count(Q, spilled=True) == 3

    got: list[FloorRow] = []
    assert floor.restore_due(Q, until_ms=10**15, limit=10, fence=1, apply=got.extend) == 3
    assert [r.job_id for r in got] == ["job-00000", "job-00001", "job-00002"]
    assert floor.count(Q, spilled=True) == 0


def test_concurrent_restore_due_skips_locked_rows(pg_floor: Floor) -> None:
    floor = pg_floor
    floor.upsert(Q, _rows(10, spilled=True), fence=1)
    entered, release = threading.Event(), threading.Event()
    first: list[FloorRow] = []
    second: list[FloorRow] = []

    def blocking_apply(rows: list[FloorRow]) -> None:
        first.extend(rows)
        entered.set()
        assert release.wait(30)

    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(floor.restore_due, Q, 10**15, 5, 1, blocking_apply)
        assert entered.wait(30)
        # Runs while the first transaction still holds its five rows.
        other = pool.submit(floor.restore_due, Q, 10**15, 5, 1, second.extend)
        assert other.result(timeout=30) == 5
        release.set()
        assert held.result(timeout=30) == 5

    first_ids, second_ids = {r.job_id for r in first}, {r.job_id for r in second}
    assert len(first_ids) == len(second_ids) == 5
    assert not first_ids & second_ids
    assert [r.job_id for r in first] == [f"job-{i:05d}" for i in range(5)]
    assert floor.count(Q, spilled=True) == 0


def test_open_rows_pages_cover_everything_once(floor: Floor) -> None:
    floor.upsert(Q, _rows(53), fence=1)
    floor.upsert("other", _rows(7), fence=1)
    seen: list[str] = []
    after: str | None = None
    while True:
        page = floor.open_rows(Q, after, 10)
        if not page:
            break
        assert len(page) <= 10
        seen.extend(r.job_id for r in page)
        after = page[-1].job_id
    assert seen == sorted(seen)
    assert len(seen) == len(set(seen)) == 53


def test_upsert_2000_rows(floor: Floor) -> None:
    rows = _rows(2000, spilled=True)
    started = time.monotonic()
    assert floor.upsert(Q, rows, fence=1) == 2000
    assert floor.upsert(Q, rows, fence=1) == 2000
    elapsed = time.monotonic() - started
    assert floor.count(Q) == 2000
    assert floor.mark_spilled(Q, [r.job_id for r in rows], fence=1) == 2000
    assert floor.close_jobs(Q, [r.job_id for r in rows[:1500]], fence=1) == 1500
    assert floor.count(Q, spilled=True) == 500
    assert elapsed < 10, f"two 2,000-row upserts took {elapsed:.1f}s"
