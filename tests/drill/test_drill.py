"""The crash-recovery drills, run for real: private redis-server, real supervisors, real
signals, a SQLite or PostgreSQL floor. Each test asserts the scenario's promise from the
report, which is computed from the handler's ledger, not from the queue's counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from echomq.supervisor.drills import handler as drill_handler
from echomq.supervisor.drills.durable import OUTBOX_JOBS
from echomq.supervisor.drills.harness import JobPlan, Observation
from echomq.supervisor.drills.scenarios import SCENARIOS, assess, run_scenario, table

from echomq.job import Job

JOBS = 200
PROCESSES = 2
NO_DUPLICATES = {"floor-outage", "rolling-restart", "producer-crash", "outbox-outage"}
OUTBOX_SCENARIOS = {"producer-crash", "outbox-outage"}  # each adds OUTBOX_JOBS by tx=


def check_promise(report: dict[str, Any]) -> None:
    shown = table([report])
    assert report["ok"], shown
    extra = OUTBOX_JOBS if report["scenario"] in OUTBOX_SCENARIOS else 0
    assert report["admitted"] == JOBS + extra, shown
    assert report["lost"] == 0 and report["dead"] == 0, shown
    accounted = report["completed"] + report["lost_immediate"] + report["lost_in_fold_window"]
    assert accounted == report["admitted"], shown
    if report["scenario"] not in ("valkey-restart", "workflow-restart"):
        assert report["lost_immediate"] == report["lost_in_fold_window"] == 0, shown
    if report["scenario"] in NO_DUPLICATES:
        assert report["duplicates"] == 0, shown
    assert report["recovery_s"] is not None, shown
    assert report["settled"], shown


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_drill_on_sqlite(scenario: str, doorbell: str) -> None:
    report = run_scenario(scenario, JOBS, PROCESSES, doorbell=doorbell)
    check_promise(report)
    if scenario == "kill-consumer":
        assert report["consumers_killed"] >= 5, table([report])
    if scenario == "floor-outage":
        assert report["supervisor_events"].get("floor-down"), table([report])
    if scenario.startswith("workflow-restart"):  # at its start, then after the restart
        assert report["supervisor_events"].get("rehydrate", 0) >= 2, table([report])


@pytest.mark.parametrize("scenario", ["kill-consumer", "floor-outage", "rolling-restart",
                                      "valkey-wipe", "producer-crash"])
def test_drill_on_postgresql(scenario: str, pg_floor_url: str, doorbell: str) -> None:
    report = run_scenario(scenario, JOBS, PROCESSES, floor_url=pg_floor_url, doorbell=doorbell)
    assert report["floor"] == "postgresql"
    check_promise(report)
    if scenario == "floor-outage":
        assert report["supervisor_events"].get("floor-down"), table([report])


@pytest.mark.parametrize("scenario", ["workflow-restart", "workflow-restart-durable"])
def test_workflow_across_a_restart_without_persistence_on_postgresql(
        scenario: str, pg_floor_url: str) -> None:
    report = run_scenario(scenario, JOBS, PROCESSES, floor_url=pg_floor_url)
    assert report["floor"] == "postgresql"
    check_promise(report)
    assert report["supervisor_events"].get("rehydrate", 0) >= 2, table([report])


def test_cli_prints_json_and_exits_zero() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "echomq.supervisor.cli", "drill", "rolling-restart", "--jobs", "60",
         "--processes", "2", "--report", "json"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["scenario"] == "rolling-restart" and report["ok"]
    assert report["admitted"] == report["completed"] == 60


def test_cli_rejects_an_unknown_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "echomq.supervisor.cli", "drill", "kill-everything"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "unknown scenario 'kill-everything'" in done.stderr


# --- the judgement, on hand-made facts ----------------------------------------------------


def _facts(scenario: str, lost: JobPlan, admitted_at: float, failed_at: float | None = None
           ) -> Observation:
    done = JobPlan("j-done", "lane-1", None, False)
    obs = Observation(scenario=scenario, floor="sqlite", queue="q", seed=1, plan=[done, lost],
                      admitted_at={"j-done": 100.0, lost.id: admitted_at},
                      ledger=[("j-done", 1, 11, "ok", 101.0)], fault_at=100.5,
                      fault_end=100.6, settled=True)
    if failed_at is not None:
        obs.ledger.append((lost.id, 1, 11, "fail", failed_at))
    return obs


def test_a_callback_before_its_members_fails_the_workflow_drill() -> None:
    member = JobPlan("j-m", "lane-1", None, False)
    callback = JobPlan("j-cb", "lane-1", None, False, after=("j-m",))

    def facts(cb_at: float) -> Observation:
        return Observation(scenario="workflow", floor="sqlite", queue="q", seed=1,
                           plan=[member, callback], admitted_at={"j-m": 100.0, "j-cb": 100.0},
                           ledger=[("j-m", 1, 11, "ok", 101.0), ("j-cb", 1, 11, "ok", cb_at)],
                           fault_at=100.5, fault_end=100.6, settled=True)

    assert assess(SCENARIOS["workflow"], facts(101.5))["ok"]
    early = assess(SCENARIOS["workflow"], facts(100.9))
    assert not early["ok"] and "ran before all their members" in early["failures"][0]


def test_a_lost_job_fails_the_drill() -> None:
    report = assess(SCENARIOS["kill-consumer"],
                    _facts("kill-consumer", JobPlan("j-x", "lane-2", None, False), 100.0))
    assert not report["ok"] and report["lost"] == 1


def test_valkey_restart_reports_but_forgives_waiting_immediate_jobs() -> None:
    report = assess(SCENARIOS["valkey-restart"],
                    _facts("valkey-restart", JobPlan("j-x", "lane-2", None, False), 100.0))
    assert report["ok"], report["failures"]
    assert report["lost"] == 0 and report["lost_immediate"] == 1
    assert "lost_immediate (expected: Valkey lost its data)" in table([report])


def test_an_immediate_job_sent_before_the_loss_may_be_lost_even_if_its_add_returned_after(
        ) -> None:
    """The admit reached the server between its sending and its return: sent before the
    loss, it may have landed on the server that lost its data (the dial allows that);
    sent after, it landed on the new one and must not be lost."""
    plan = JobPlan("j-x", "lane-2", None, False)
    for sent, ok in ((100.45, True), (100.55, False)):  # the loss at 100.5
        obs = _facts("valkey-restart", plan, 100.6)  # returned (stamped) after the loss
        obs.sent_at = {"j-done": 100.0, "j-x": sent}
        report = assess(SCENARIOS["valkey-restart"], obs)
        assert report["ok"] is ok, report["failures"]
        assert report["lost"] == (0 if ok else 1)


@pytest.mark.parametrize(("plan", "failed_at"), [
    (JobPlan("j-x", "lane-2", 1.5, False), None),  # deferred, admitted well before the loss
    (JobPlan("j-x", "lane-2", None, True), 99.5),  # failed once well before: a retry
])
def test_valkey_restart_must_not_lose_deferred_or_retried_jobs(plan: JobPlan,
                                                               failed_at: float | None) -> None:
    report = assess(SCENARIOS["valkey-restart"],
                    _facts("valkey-restart", plan, 99.0, failed_at))
    assert not report["ok"] and report["lost"] == 1


def test_duplicates_fail_a_rolling_restart_but_not_a_valkey_stall() -> None:
    plan = JobPlan("j-x", "lane-2", None, False)
    for name, ok in (("rolling-restart", False), ("valkey-stall", True)):
        obs = _facts(name, plan, 100.0)
        obs.ledger += [("j-x", 1, 12, "ok", 100.2), ("j-x", 2, 13, "ok", 103.0)]
        report = assess(SCENARIOS[name], obs)
        assert report["duplicates"] == 1 and report["duplicate_runs"] == {"2": 1}
        assert report["ok"] is ok, report["failures"]


def test_a_run_again_is_explained_by_its_row_open_at_the_loss_within_a_bounded_lag() -> None:
    """A job run twice whose first run ended outside the one-beat window is explained only
    by its floor row still open at the loss (or its id in the fold log then), and only
    within the scheduler lag's bound."""
    from echomq.supervisor.drills.scenarios import FOLD_WINDOW_S, SCHEDULER_LAG_S

    def report(first_end: float, open_at_loss: set[str], unfolded: frozenset[str] = frozenset(),
               second_end: float = 101.0) -> dict[str, Any]:
        obs = _facts("workflow-restart-durable", JobPlan("j-x", "lane-2", 1.5, False), 99.0)
        obs.ledger += [("j-x", 1, 12, "ok", first_end), ("j-x", 1, 13, "ok", second_end)]
        obs.open_at_loss = open_at_loss
        obs.unfolded_at_loss = set(unfolded)
        return assess(SCENARIOS["workflow-restart-durable"], obs)

    late = 100.5 - FOLD_WINDOW_S - 0.05  # just outside the one-beat window
    assert not report(late, set())["ok"]
    explained = report(late, {"j-x"})
    assert explained["ok"], explained["failures"]
    assert any("closed later than a beat" in n for n in explained["notes"])
    # read from the fold log before the floor: a fold under way at the loss wrote its row
    assert report(late, set(), frozenset({"j-x"}))["ok"]
    never_closed = report(100.5 - SCHEDULER_LAG_S - 0.05, {"j-x"})
    assert not never_closed["ok"] and "outside the loss's window" in never_closed["failures"][0]
    before = report(late, {"j-x"}, second_end=100.4)  # both runs ended before the loss
    assert not before["ok"] and "outside the loss's window" in before["failures"][0]


@pytest.mark.parametrize("scenario", ["valkey-restart", "workflow-restart"])
def test_a_deferred_job_lost_later_than_a_beat_is_forgiven_only_from_the_fold_log(
        scenario: str) -> None:
    """Lost with Valkey more than a beat after it was deferred, a job is in the dial's
    window only if it was still waiting in the fold log at the loss while the supervisor
    reported its scheduler's beat late, and only within the lag's bound; one neither
    folded nor in the log is a fold that missed it, and a late fold nobody reported is
    a scheduler that stood still unseen."""
    from echomq.supervisor.drills.scenarios import FOLD_WINDOW_S, SCHEDULER_LAG_S

    def report(admitted_at: float, unfolded: set[str],
               late: tuple[float, float] | None = (100.0, 100.6)) -> dict[str, Any]:
        obs = _facts(scenario, JobPlan("j-x", "lane-2", 1.5, False), admitted_at)
        obs.unfolded_at_loss = unfolded
        obs.late_beats = [late] if late else []
        return assess(SCENARIOS[scenario], obs)

    late = 100.5 - FOLD_WINDOW_S - 0.05  # just outside the one-beat window
    missed = report(late, set())
    assert not missed["ok"] and missed["lost"] == 1
    waited = report(late, {"j-x"})
    assert waited["ok"], waited["failures"]
    assert waited["lost"] == 0 and waited["lost_in_fold_window"] == 1
    assert any("waited in the fold log longer than a beat" in n for n in waited["notes"])
    assert report(late, {"j-x"}, None)["lost"] == 1  # no late beat reported
    assert report(late, {"j-x"}, (99.0, 99.5))["lost"] == 1  # one over before it entered
    stuck = report(100.5 - SCHEDULER_LAG_S - 0.05, {"j-x"})
    assert not stuck["ok"] and stuck["lost"] == 1


@pytest.mark.parametrize(("plan", "runs"), [
    (JobPlan("j-x", "lane-2", 1.5, True), [("j-x", 1, 11, "fail", 100.2)]),  # a retry too
    (JobPlan("j-x", "lane-2", 1.5, False, after=("j-done",)), []),  # a callback
])
def test_a_late_fold_is_not_forgiven_a_job_that_entered_the_fold_log_again(
        plan: JobPlan, runs: list[tuple[str, int, int, str, float]]) -> None:
    """A deferred job that failed (its retry enters the fold log again) or a callback
    (each member's end puts it back) may be in the log at the loss although a fold
    missed its first entry: the fold log does not excuse it."""
    from echomq.supervisor.drills.scenarios import FOLD_WINDOW_S

    obs = _facts("workflow-restart", plan, 100.5 - FOLD_WINDOW_S - 0.05)
    obs.ledger += runs
    obs.unfolded_at_loss = {"j-x"}
    obs.late_beats = [(100.0, 100.6)]
    report = assess(SCENARIOS["workflow-restart"], obs)
    assert not report["ok"] and report["lost"] == 1


# --- the handler ---------------------------------------------------------------------------


def test_handler_fails_attempt_one_then_records_one_success_per_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "ledger.db"
    monkeypatch.setenv(drill_handler.LEDGER_ENV, str(ledger))
    monkeypatch.delenv(drill_handler.NOTIFY_ENV, raising=False)
    monkeypatch.setattr(drill_handler, "_state", drill_handler._PerProcess())

    def job(attempt: int) -> Job:
        return Job(id="j1", name="drill", payload={"fail_first": True, "work_ms": 1},
                   lane="default", state="active", attempts=attempt)

    with pytest.raises(drill_handler.DrillFailure):
        drill_handler.handle(job(1))
    drill_handler.handle(job(2))
    pid = os.fork()
    if pid == 0:  # the child must open its own connection, as a forked consumer does
        code = 0
        try:
            drill_handler.handle(job(3))
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    conn = drill_handler.open_ledger(str(ledger))
    rows = conn.execute("SELECT attempt, pid, kind FROM executions ORDER BY rowid").fetchall()
    conn.close()
    assert rows == [(1, os.getpid(), "fail"), (2, os.getpid(), "ok"), (3, pid, "ok")]
