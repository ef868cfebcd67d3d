"""``echomq`` end to end: every subcommand as a subprocess on a real server, the --json
shapes, human tables, exit codes (0 done, 1 not found/refused, 2 usage), redacted errors."""

from __future__ import annotations

from typing import Any

import pytest

import echomq
from echomq.lanes import Lanes

from .conftest import make_dead, run_cli

COUNTS = {"waiting", "scheduled", "active", "completed", "dead", "cancelled"}


def test_queues_lists_every_queue_with_counts(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i) for i in range(3)])
    res = cli("queues", "--json")
    assert res.code == 0, res.err
    [row] = [r for r in res.json if r["queue"] == queue_name]
    assert set(row) >= COUNTS and row["waiting"] == 3 and row["paused"] is False
    human = cli("queues")
    assert human.code == 0 and "queue" in human.out.splitlines()[0]
    assert any(line.split()[:2] == [queue_name, "3"] for line in human.out.splitlines())


def test_stats_json_and_table(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add_many([("x", i, {"lane": "big" if i < 4 else "small"}) for i in range(5)])
    q.add("later", None, delay=60)
    res = cli("stats", queue_name, "--json")
    assert res.code == 0, res.err
    s = res.json
    assert COUNTS | {"retried", "spilled", "lanes", "paused", "oldest_waiting_s",
                     "busiest_lanes", "queue"} <= set(s)
    assert (s["waiting"], s["scheduled"], s["lanes"]) == (5, 1, 2)
    assert s["busiest_lanes"][0] == {"lane": "big", "waiting": 4}
    text = cli("stats", queue_name)
    assert text.code == 0 and "waiting" in text.out and "big (4)" in text.out


def test_jobs_lists_a_state_with_a_cursor(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", {"i": i}) for i in range(5)])
    first = cli("--json", "jobs", queue_name, "--state", "waiting", "--limit", "3")
    assert first.code == 0, first.err
    page = first.json
    assert page["state"] == "waiting" and len(page["jobs"]) == 3 and page["next_cursor"]
    assert {"id", "name", "state", "lane", "attempts", "payload", "error"} <= set(page["jobs"][0])
    rest = cli("jobs", queue_name, "--state", "waiting", "--cursor", page["next_cursor"],
               "--json").json
    assert [j["id"] for j in page["jobs"] + rest["jobs"]] == ids
    table = cli("jobs", queue_name, "--state", "waiting", "--limit", "2")
    assert table.code == 0 and ids[0] in table.out and "more: --cursor" in table.out
    assert cli("jobs", queue_name, "--state", "nonsense").code == 2
    assert cli("jobs", queue_name).code == 2  # --state is required
    assert cli("jobs", queue_name, "--state", "waiting", "--cursor", "x;y").code == 2


def test_show_one_job_and_unknown_ones(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    [dead] = make_dead(q, 1, "ValueError: no such mailbox")
    res = cli("show", queue_name, dead, "--json")
    assert res.code == 0, res.err
    assert res.json["id"] == dead and res.json["state"] == "dead"
    assert "no such mailbox" in res.json["error"]
    human = cli("show", queue_name, dead)
    assert human.code == 0 and "error:" in human.out and "no such mailbox" in human.out
    missing = cli("show", queue_name, "nope")
    assert missing.code == 1 and "unknown job 'nope'" in missing.err
    gone = cli("show", "no-such-queue-here", "x")
    assert gone.code == 1 and "unknown queue" in gone.err
    assert cli("show", "bad{name}", "x").code == 2


def test_retry_moves_dead_jobs_back(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    one, two, three = make_dead(q, 3)
    res = cli("retry", queue_name, one, "--json")
    assert res.code == 0 and res.json == {"queue": queue_name, "retried": 1}
    assert q.get(one).state == "waiting"  # type: ignore[union-attr]
    again = cli("retry", queue_name, one)
    assert again.code == 1 and "not dead" in again.err
    rest = cli("retry", queue_name)
    assert rest.code == 0 and "retried 2" in rest.out
    assert q.counts()["dead"] == 0 and q.counts()["waiting"] == 3


def test_cancel_waiting_scheduled_and_active_refuses_finished_and_unknown(
        cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    active = q.add("x", 1)
    Lanes(q.redis, q.keys, q.settings).claim(1)
    waiting = q.add("x", 2)
    scheduled = q.add("x", 3, delay=60)
    ok = cli("cancel", queue_name, waiting, "--json")
    assert ok.code == 0 and ok.json["cancelled"] is True
    assert cli("cancel", queue_name, scheduled).code == 0
    running = cli("cancel", queue_name, active, "--json")
    assert running.code == 0 and running.json["cancelled"] is True
    assert q.get(active).error == "cancelled while running"  # type: ignore[union-attr]
    assert cli("cancel", queue_name, "nope").code == 1
    again = cli("cancel", queue_name, waiting, "--json")
    assert again.code == 1 and "is cancelled" in again.err
    assert again.json == {"queue": queue_name, "id": waiting, "cancelled": False,
                          "state": "cancelled", "error": again.err.strip()[len("echomq: "):]}
    assert q.counts()["cancelled"] == 3


def test_pause_and_resume(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", 1)
    res = cli("pause", queue_name, "--json")
    assert res.code == 0 and res.json == {"queue": queue_name, "paused": True, "changed": True}
    assert q.is_paused()
    assert "already paused" in cli("pause", queue_name).out
    assert cli("stats", queue_name, "--json").json["paused"] is True
    assert "PAUSED" in cli("stats", queue_name).out
    res = cli("resume", queue_name, "--json")
    assert res.code == 0 and res.json["paused"] is False and res.json["changed"] is True
    assert not q.is_paused()


def test_purge_a_finished_state(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = make_dead(q, 4)
    res = cli("purge", queue_name, "--state", "dead", "--json")
    assert res.code == 0 and res.json == {"queue": queue_name, "state": "dead", "purged": 4}
    assert q.get(ids[0]) is None and q.counts()["dead"] == 0
    assert cli("purge", queue_name, "--state", "waiting").code == 2


def test_unreachable_server_is_a_clear_error_without_the_password() -> None:
    res = run_cli("stats", "q", url="redis://user:s3cret-pw@127.0.0.1:1/0")
    assert res.code == 1
    assert "cannot reach" in res.err and "***" in res.err and "s3cret-pw" not in res.err
    assert "Traceback" not in res.err


def test_url_from_the_environment_and_usage_errors(redis_url: str, queue_name: str) -> None:
    echomq.Queue(queue_name, redis_url=redis_url).add("x", 1)
    res = run_cli("stats", queue_name, "--json", env={"ECHOMQ_REDIS_URL": redis_url})
    assert res.code == 0 and res.json["waiting"] == 1
    assert run_cli().code == 2
    assert run_cli("frobnicate").code == 2
    assert run_cli("stats", url="not-a-url://x").code == 2


@pytest.mark.parametrize("command", ["queues", "stats", "jobs", "show", "retry", "cancel",
                                     "pause", "resume", "purge", "crons", "dashboard"])
def test_every_subcommand_has_help(command: str) -> None:
    res = run_cli(command, "--help")
    assert res.code == 0 and "usage: echomq" in res.out


def test_dashboard_on_a_taken_port_is_a_clear_error(redis_url: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run_cli("dashboard", "--port", str(port), url=redis_url)
    assert res.code == 1 and "cannot serve the dashboard" in res.err
    assert "Traceback" not in res.err


def test_retry_without_ids_moves_every_dead_job(cli: Any, redis_url: str,
                                                queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    make_dead(q, 2_345)
    res = cli("retry", queue_name, "--json")
    assert res.code == 0 and res.json["retried"] == 2_345
    assert q.counts()["dead"] == 0 and q.counts()["waiting"] == 2_345


def test_crons_lists_the_queues_crons(cli: Any, redis_url: str, queue_name: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    assert cli("crons", queue_name).code == 1  # unknown queue
    q.add_cron("nightly", "0 3 * * *", "report", {"kind": "daily"}, tz="Europe/Paris")
    q.add_cron("tick", "*/10 * * * * *", "ping")
    res = cli("crons", queue_name, "--json")
    assert res.code == 0, res.err
    assert [(c["key"], c["expr"], c["tz"], c["payload"]) for c in res.json] == [
        ("nightly", "0 3 * * *", "Europe/Paris", {"kind": "daily"}),
        ("tick", "*/10 * * * * *", "UTC", None)]
    assert all(c["next_ms"] > c["last_ms"] for c in res.json)
    human = cli("crons", queue_name)
    assert human.code == 0 and human.out.splitlines()[0].split()[:3] == ["key", "expr", "tz"]
    assert "nightly" in human.out and "*/10 * * * * *" in human.out
