"""--concurrency and --job-timeout: flags, environment variables, bad values."""

from __future__ import annotations

import pytest
from echomq.supervisor.cli import build_parser, settings_from_args

from echomq.errors import ConfigError


def test_concurrency_and_job_timeout_come_from_flags_or_the_environment() -> None:
    base = ["start", "--queue", "q", "--handler", "m:f"]
    settings = settings_from_args(build_parser().parse_args(
        [*base, "--concurrency", "20", "--job-timeout", "2.5"]))
    assert (settings.concurrency, settings.job_timeout) == (20, 2.5)
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("ECHOMQ_CONCURRENCY", "7")
        mp.setenv("ECHOMQ_JOB_TIMEOUT", "30")
        settings = settings_from_args(build_parser().parse_args(base))
        assert (settings.concurrency, settings.job_timeout) == (7, 30.0)
        mp.setenv("ECHOMQ_CONCURRENCY", "0")
        with pytest.raises(ConfigError, match="concurrency"):
            settings_from_args(build_parser().parse_args(base))
    finally:
        mp.undo()
    assert settings_from_args(build_parser().parse_args(base)).job_timeout is None


def test_lane_limit_comes_from_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["start", "--queue", "q", "--handler", "m:f"]
    assert settings_from_args(build_parser().parse_args(base)).lane_limit is None
    settings = settings_from_args(build_parser().parse_args([*base, "--lane-limit", "3"]))
    assert settings.lane_limit == 3
    monkeypatch.setenv("ECHOMQ_LANE_LIMIT", "1")
    assert settings_from_args(build_parser().parse_args(base)).lane_limit == 1
    monkeypatch.setenv("ECHOMQ_LANE_LIMIT", "0")
    with pytest.raises(ConfigError, match="lane_limit"):
        settings_from_args(build_parser().parse_args(base))
