"""Migrations up and down on both backends, and the at-head check."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from echomq.errors import FloorSchemaError
from echomq.floor import Floor

TABLES = {"emq_floor_jobs", "emq_floor_fences", "emq_floor_crons"}
INDEX = "ix_emq_floor_jobs_queue_spilled_due"


def _tables(floor: Floor) -> set[str]:
    engine = sa.create_engine(floor._engine.url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _indexes(floor: Floor) -> set[str]:
    engine = sa.create_engine(floor._engine.url)
    try:
        return {ix["name"] for ix in sa.inspect(engine).get_indexes("emq_floor_jobs")}
    finally:
        engine.dispose()


def test_up_down_up(empty_floor: Floor) -> None:
    head = empty_floor.head_revision()
    assert empty_floor.current_revision() is None
    assert not TABLES & _tables(empty_floor)

    empty_floor.upgrade()
    assert empty_floor.current_revision() == head
    assert _tables(empty_floor) >= TABLES
    assert INDEX in _indexes(empty_floor)

    empty_floor.downgrade("base")
    assert empty_floor.current_revision() is None
    assert not TABLES & _tables(empty_floor)

    empty_floor.upgrade("head")
    assert empty_floor.current_revision() == head
    assert _tables(empty_floor) >= TABLES


def test_upgrade_at_head_is_a_no_op_and_keeps_rows(floor: Floor) -> None:
    from echomq.floor import FloorRow

    floor.upsert("q", [FloorRow("kept", 123, {"name": "x"})], fence=1)
    floor.upgrade()
    assert floor.current_revision() == floor.head_revision()
    rows = {row.job_id: row for row in floor.open_rows("q", None, 10)}
    assert rows["kept"].due_ms == 123 and rows["kept"].fields == {"name": "x"}


def test_check_at_head(empty_floor: Floor) -> None:
    head = empty_floor.head_revision()
    with pytest.raises(FloorSchemaError) as info:
        empty_floor.check_at_head()
    message = str(info.value)
    assert head in message
    assert "base" in message
    assert f"echomq-supervisor migrate --floor-url {empty_floor.url_redacted}" in message

    empty_floor.upgrade()
    empty_floor.check_at_head()


def test_check_at_head_hides_the_password(pg_url: str) -> None:
    # The local server trusts every login, so any password connects.
    url = sa.make_url(pg_url).set(password="hunter2").render_as_string(hide_password=False)
    floor = Floor.from_url(url)
    try:
        with pytest.raises(FloorSchemaError) as info:
            floor.check_at_head()
        assert "hunter2" not in str(info.value)
        assert ":***@" in str(info.value)
    finally:
        floor.dispose()


def test_migrations_ship_as_package_data(floor: Floor) -> None:
    from importlib.resources import files

    root = files("echomq.migrations")
    assert root.joinpath("env.py").is_file()
    assert root.joinpath("script.py.mako").is_file()
    assert root.joinpath("versions", "0001_floor.py").is_file()
    assert root.joinpath("versions", "0002_crons.py").is_file()
    assert root.joinpath("versions", "0003_lane_limits.py").is_file()


def test_crons_revision_up_and_down_keeps_the_jobs(empty_floor: Floor) -> None:
    """0001 -> 0002 adds the crons table beside existing rows; down to 0001 drops it alone."""
    from echomq.floor import FloorRow

    empty_floor.upgrade("0001_floor")
    assert "emq_floor_crons" not in _tables(empty_floor)
    empty_floor.upsert("q", [FloorRow("kept", 5, {"name": "x"})], fence=1)
    empty_floor.upgrade("0002_crons")
    assert empty_floor.current_revision() == "0002_crons"
    empty_floor.put_crons("q", [("nightly", '{"expr":"0 3 * * *"}', 7)], None)
    assert empty_floor.cron_rows("q") == [("nightly", '{"expr":"0 3 * * *"}', 7)]
    empty_floor.downgrade("0001_floor")
    assert "emq_floor_crons" not in _tables(empty_floor)
    assert [r.job_id for r in empty_floor.open_rows("q", None, 10)] == ["kept"]
    empty_floor.upgrade()
    assert empty_floor.cron_rows("q") == []


def test_lane_limits_revision_up_and_down_keeps_the_rest(empty_floor: Floor) -> None:
    """0002 -> 0003 adds the lane limits table beside jobs and crons; down drops it alone."""
    from echomq.floor import FloorRow

    empty_floor.upgrade("0002_crons")
    assert "emq_floor_lane_limits" not in _tables(empty_floor)
    empty_floor.upsert("q", [FloorRow("kept", 5, {"name": "x"})], fence=1)
    empty_floor.put_crons("q", [("nightly", "{}", 7)], None)
    empty_floor.upgrade("0003_lane_limits")
    assert empty_floor.current_revision() == "0003_lane_limits"
    empty_floor.put_lane_limits("q", {"a": "1"}, fence=1)
    assert empty_floor.lane_limit_rows("q") == {"a": "1"}
    empty_floor.downgrade("0002_crons")
    assert "emq_floor_lane_limits" not in _tables(empty_floor)
    assert [r.job_id for r in empty_floor.open_rows("q", None, 10)] == ["kept"]
    assert empty_floor.cron_rows("q") == [("nightly", "{}", 7)]


def test_durable_revision_adds_the_outbox_and_keeps_the_rows(empty_floor: Floor) -> None:
    """0003 -> 0004 adds the outbox table and the rows' admit order; down drops them."""
    from echomq.floor import FloorRow

    empty_floor.upgrade("0003_lane_limits")
    empty_floor.upsert("q", [FloorRow("kept", 5, {"name": "x"})], fence=1)
    empty_floor.upgrade()
    assert empty_floor.current_revision() == "0004_durable" == empty_floor.head_revision()
    assert "emq_outbox" in _tables(empty_floor)
    assert [r.seq for r in empty_floor.rows_in_order("q", None, 10)] == [0]
    empty_floor.downgrade("0003_lane_limits")
    assert "emq_outbox" not in _tables(empty_floor)
    assert [r.job_id for r in empty_floor.open_rows("q", None, 10)] == ["kept"]
