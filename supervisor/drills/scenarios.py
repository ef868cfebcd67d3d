"""``echomq-supervisor drill SCENARIO``: crash-recovery drills against real processes.

Each drill starts a private redis-server, migrates a floor (a SQLite file in a
temporary directory unless ``--floor-url`` is given), starts a real supervisor
running :mod:`echomq.supervisor.drills.handler`, admits a paced mix of immediate,
delayed and fail-once jobs across many lanes, injects one fault while work is
in flight, waits for the queue to settle and reports, from the handler's
ledger (never from the queue's own counters): admitted, completed, lost,
executed more than once, dead, and the time from the fault to full recovery.

==================  ===============================================  ==============================
scenario            fault                                            what the promise says
==================  ===============================================  ==============================
kill-consumer       SIGKILL a random consumer every few 100 ms        nothing lost; duplicates only
                                                                     for jobs in flight at a kill
kill-supervisor     SIGKILL the supervisor and consumers, start anew  nothing lost (leases expire)
valkey-restart      kill redis-server, start it empty on its port     deferred/retried: none lost;
                                                                     waiting immediate: reported
valkey-stall        SIGSTOP redis-server for seconds, then SIGCONT    nothing lost, no crash loop
floor-outage        the floor unreachable for several seconds         none lost or run twice, the
                                                                     queue keeps running
rolling-restart     SIGTERM the supervisor as a second one starts     none lost, none run twice
cluster-failover    on a 3+3 Valkey Cluster, SIGKILL the queue's      none lost of the admits acked
                    master; its replica is elected in its place       with WAIT 1 (durability sync)
valkey-wipe         FLUSHALL mid-run under the durable dial           none lost
producer-crash      a producer SIGKILLed right after its tx= commit   every committed job runs once
outbox-outage       the application's outbox database unreachable     none lost, none run twice
workflow            chords (9 members, a callback waiting for them,   as kill-consumer, and every
                    ``after=``): kill-consumer, then kill-supervisor  callback ran after all its
                                                                     members, none dead or early
workflow-restart    chords, Valkey restarted without persistence      as valkey-restart; every
                    mid-workflow, the queue on the folded dial        callback ran once, after its
                                                                     members (those lost with
                                                                     Valkey count as completed)
workflow-restart-   the same on the durable dial                      none lost; a run twice only
durable                                                              within a beat of the loss, or
                                                                     with its row still open at
                                                                     the loss (at most 5 beats)
==================  ===============================================  ==============================

valkey-wipe, producer-crash and outbox-outage are in :mod:`echomq.supervisor.drills.durable`.

``drill all`` runs every scenario in turn and prints one table. The exit code
is 1 when any promise was broken, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echomq.supervisor.drills import durable
from echomq.supervisor.drills.harness import BEAT_MS, Harness, JobPlan, Observation

KILL_EVERY_S = 0.3
KILL_FOR_S = 3.0
STALL_S = 12.0  # longer than the clients' 10 s socket timeout: they must time out and reconnect
FLOOR_OUTAGE_S = 6.0  # longer than SQLite's 5 s busy timeout: writers must fail, not just wait
FOLD_WINDOW_S = BEAT_MS / 1000 + 0.15  # "folded within one beat" plus the SQL write
# the latest a scheduler's turn may come: five beats, its beat delayed by a starved machine.
# A completed job's row still open at a loss, or a job still in the fold log at a loss,
# longer than that is a close or a fold that went missing
SCHEDULER_LAG_S = 5 * BEAT_MS / 1000
FAULT_AFTER = 0.2  # inject the fault once this share of the plan has completed
RUNNING_GAP_S = 1.0  # "the queue keeps running": no longer stretch without a completion
CLUSTER_HEAL_S = 30.0  # a failover takes about two node timeouts; this bounds the wait
REHYDRATE_S = 20.0  # bounds the wait for the scheduler's rehydration after a restart
RETRY_SLACK_S = 0.3  # a failed attempt's retry is due within its 0.2 s (+20 % jitter) backoff


@dataclass(frozen=True)
class Scenario:
    """A fault and what the delivery promise says about it."""

    name: str
    fault: Callable[[Harness], None]
    duplicates_allowed: bool
    valkey_lost: bool = False  # immediate jobs waiting at the fault may be lost (reported)
    kills: bool = False  # duplicates must come from processes the drill killed
    durable: bool = False  # every admitted job is on the floor: none may be lost
    # duplicates must come from the fault: an earlier run ended within a beat before the loss
    # or before the rehydration ended (the close window)
    loss_window: bool = False
    setup: Callable[[Harness], None] | None = None  # before the supervisor starts


# --- faults --------------------------------------------------------------------------------


def kill_consumer(h: Harness) -> None:
    """Scenario: SIGKILL a random consumer process again and again for a while."""
    rng = random.Random(h.seed)
    end = time.monotonic() + KILL_FOR_S
    h.obs.fault_at = time.time()
    while time.monotonic() < end:
        kids = h.current.children()
        if kids:
            pid = rng.choice(kids)
            try:
                os.kill(pid, signal.SIGKILL)
                h.obs.killed_pids.add(pid)
            except ProcessLookupError:
                pass
        h.pause(KILL_EVERY_S)
    h.obs.fault_end = time.time()


def kill_supervisor(h: Harness) -> None:
    """Scenario: SIGKILL the supervisor and its children, then start a new one."""
    h.obs.fault_at = time.time()
    h.obs.killed_pids.update(h.current.kill_tree())
    h.start_supervisor()
    h.obs.fault_end = time.time()


def workflow_faults(h: Harness) -> None:
    """Scenario: kill-consumer, then SIGKILL the supervisor mid-workflow and start anew."""
    kill_consumer(h)
    fault_at = h.obs.fault_at
    kill_supervisor(h)
    h.obs.fault_at = fault_at


def valkey_restart(h: Harness) -> None:
    """Scenario: restart Valkey with its data lost."""
    try:
        h.hold_writes_for_loss()  # stamps the loss
    finally:
        h.redis.restart_empty()
    h.obs.fault_end = time.time()


def workflow_restart(h: Harness) -> None:
    """Scenario: restart Valkey without persistence mid-workflow; the fault ends once the
    supervisor's scheduler has rehydrated the queue from the floor."""
    before = h.current.events["rehydrate"]
    # writes held, the server takes no settle: the floor's rows read now, with the fold log
    # read before them (a fold under way may still write those), are the rows open when
    # its data goes (a close committed meanwhile only drops a row that is not restored)
    try:
        h.hold_writes_for_loss()  # stamps the loss
        h.obs.open_at_loss = h.floor_ids()
    finally:
        h.redis.restart_empty()
    if not h.current.wait_event("rehydrate", before, REHYDRATE_S):
        h.obs.notes.append(f"no rehydration logged within {REHYDRATE_S}s of the restart")
    h.obs.fault_end = time.time()


def folded_dial(h: Harness) -> None:
    """Setup: the supervisor on the "folded" dial (the producer needs no floor)."""
    h.durability = "folded"


def valkey_stall(h: Harness) -> None:
    """Scenario: freeze Valkey (SIGSTOP) for a while, then let it go on."""
    h.obs.fault_at = time.time()
    h.redis.pause()
    try:
        h.pause(STALL_S)
    finally:
        h.redis.resume()
    h.obs.fault_end = time.time()


class FloorOutage:
    """Make the floor unreachable, then bring it back.

    PostgreSQL: ``ALLOW_CONNECTIONS false`` and terminate the database's backends.
    SQLite (the drill runs as root, so permissions cannot lock anyone out): hold the
    write lock so every writer waits out its busy timeout and fails, and, when the
    drill owns the file's directory, rename that directory away so no new connection
    can open the file (the -wal and -shm files travel with it).
    """

    def __init__(self, floor_url: str, owned_dir: Path | None) -> None:
        from sqlalchemy.engine import make_url

        self.url = make_url(floor_url)
        self.owned_dir = owned_dir
        self.lock: sqlite3.Connection | None = None
        self.moved: Path | None = None
        self.admin: Any = None

    def begin(self) -> None:
        """Make the floor unusable: hold SQLite's write lock (and hide its directory)."""
        if self.url.get_backend_name() == "sqlite":
            self.lock = sqlite3.connect(str(self.url.database), timeout=30,
                                        isolation_level=None)
            self.lock.execute("BEGIN IMMEDIATE")
            if self.owned_dir is not None:
                self.moved = self.owned_dir.with_name(self.owned_dir.name + ".away")
                os.rename(self.owned_dir, self.moved)
            return
        import sqlalchemy as sa

        name = self.url.database
        admin_url = self.url.set(drivername="postgresql+psycopg", database="postgres")
        self.admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})

    def end(self) -> None:
        """Give the floor back."""
        if self.moved is not None and self.owned_dir is not None:
            os.rename(self.moved, self.owned_dir)
            self.moved = None
        if self.lock is not None:
            self.lock.execute("ROLLBACK")
            self.lock.close()
            self.lock = None
        if self.admin is not None:
            with self.admin.connect() as conn:
                conn.exec_driver_sql(f'ALTER DATABASE "{self.url.database}" '
                                     "ALLOW_CONNECTIONS true")
            self.admin.dispose()
            self.admin = None


def floor_outage(h: Harness) -> None:
    """Scenario: the floor is unreachable for a while."""
    outage = FloorOutage(h.floor_url, h.owned_floor_dir)
    h.obs.fault_at = time.time()
    try:
        outage.begin()
        h.pause(FLOOR_OUTAGE_S)
    finally:
        outage.end()
    h.obs.fault_end = time.time()


def rolling_restart(h: Harness) -> None:
    """Scenario: start a new supervisor, then SIGTERM the old one (a deploy)."""
    old = h.current
    h.obs.fault_at = time.time()
    new = h.start_supervisor(wait=False)  # the new pod starts while the old one drains
    old.terminate()
    code = old.wait(60)
    h.obs.expected_exits[old.pid] = code
    if not new.wait_started():
        h.obs.notes.append(f"the second supervisor did not start; log {new.log_path}")
    h.obs.fault_end = time.time()


def cluster_failover(h: Harness) -> None:
    """Scenario: SIGKILL the cluster master that owns the queue; its replica takes over."""
    assert h.cluster is not None
    victim = h.cluster.master_of(f"emq:{{{h.queue}}}:wake")
    h.obs.fault_at = time.time()
    victim.kill()
    h.cluster.wait_ok(CLUSTER_HEAL_S)  # the replica is master and every node agrees
    h.obs.fault_end = time.time()
    h.obs.notes.append(f"master :{victim.port} killed; replica "
                       f":{h.cluster.master_of(f'emq:{{{h.queue}}}:wake').port} took over in "
                       f"{h.obs.fault_end - h.obs.fault_at:.2f}s")


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("kill-consumer", kill_consumer, duplicates_allowed=True, kills=True),
    Scenario("kill-supervisor", kill_supervisor, duplicates_allowed=True, kills=True),
    Scenario("valkey-restart", valkey_restart, duplicates_allowed=True, valkey_lost=True),
    Scenario("valkey-stall", valkey_stall, duplicates_allowed=True),
    Scenario("floor-outage", floor_outage, duplicates_allowed=False),
    Scenario("rolling-restart", rolling_restart, duplicates_allowed=False),
    # completions not yet replicated at the kill run again on the new master
    Scenario("cluster-failover", cluster_failover, duplicates_allowed=True),
    # a job completed less than a beat before the wipe may run again (its row still open)
    Scenario("valkey-wipe", durable.valkey_wipe, duplicates_allowed=True,
             setup=durable.durable_dial),
    Scenario("producer-crash", durable.producer_crash, duplicates_allowed=False),
    Scenario("outbox-outage", durable.outbox_outage, duplicates_allowed=False,
             setup=durable.app_database),
    # chords under kill-consumer: a callback runs once its members completed, never before
    Scenario("workflow", workflow_faults, duplicates_allowed=True, kills=True),
    # chords across a restart without persistence: a member lost with Valkey (folded:
    # immediate jobs live in Valkey alone) counts as completed; a callback runs once
    Scenario("workflow-restart", workflow_restart, duplicates_allowed=True, valkey_lost=True,
             loss_window=True, setup=folded_dial),
    Scenario("workflow-restart-durable", workflow_restart, duplicates_allowed=True,
             valkey_lost=True, durable=True, loss_window=True, setup=durable.durable_dial),
)}


# --- running -----------------------------------------------------------------------------


def run_scenario(name: str, jobs: int = 300, processes: int = 2, floor_url: str | None = None,
                 seed: int | None = None, keep: bool = False,
                 doorbell: str = "list") -> dict[str, Any]:
    """Run one drill end to end and return its report (``report["ok"]`` is the verdict).
    The working directory (logs, ledger) is kept when the drill fails or ``keep`` is set."""
    scenario = SCENARIOS[name]
    harness = Harness(name, jobs, processes, floor_url, seed, doorbell)
    report: dict[str, Any] | None = None
    try:
        with harness as h:
            if scenario.setup is not None:
                scenario.setup(h)
            h.start_supervisor()
            h.start_producer()
            h.wait_progress(FAULT_AFTER)
            scenario.fault(h)
            h.obs.settled = h.wait_settled()
            h.stop_supervisors()
            report = assess(scenario, h.collect())
    except Exception as exc:  # a drill that cannot run is a failed drill, with the reason
        report = {"scenario": name, "ok": False, "failures": [f"drill error: {exc}"],
                  "workdir": str(harness.workdir)}
    finally:
        if report is not None and report.get("ok") and not keep:
            harness.cleanup()
            report["workdir"] = None
    return report


# --- judging -----------------------------------------------------------------------------


def assess(scenario: Scenario, obs: Observation) -> dict[str, Any]:
    """Turn the facts into the report: counts from the ledger, then the promise checks."""
    ok_runs: dict[str, list[tuple[int, float]]] = {}
    first_fail: dict[str, float] = {}
    for job_id, _attempt, pid, kind, at in obs.ledger:
        if kind == "ok":
            ok_runs.setdefault(job_id, []).append((pid, at))
        else:
            first_fail.setdefault(job_id, at)
    admitted = obs.admitted_at
    plans = {p.id: p for p in obs.plan}
    completed = {j for j in admitted if j in ok_runs}
    dead = {j for j in admitted if j not in ok_runs and j in obs.dead_ids}
    missing = sorted(j for j in admitted if j not in ok_runs and j not in obs.dead_ids)
    fault_at = obs.fault_at or 0.0
    broken: list[str] = []  # lost although the promise covers them
    expected: list[str] = []  # immediate jobs waiting in a Valkey that lost its data
    window: list[str] = []  # deferred or retried, not yet folded at the loss
    late_folds: list[float] = []  # how long those folded late had waited in the fold log
    unfolded = obs.unfolded_at_loss or set()
    for j in missing:
        # sent after the loss, its admit reached the new server; one sent before may have
        # landed on the old one even if it returned (and was stamped) after the loss began
        if not scenario.valkey_lost or obs.sent_at.get(j, admitted[j]) >= fault_at:
            broken.append(j)
            continue
        if scenario.durable:  # on the floor before its admit returned
            broken.append(j)
            continue
        failed = first_fail.get(j)
        # a deferred job, and a blocked one (a callback), enter the fold log at their admit
        entered = admitted[j] if plans[j].delay or plans[j].after else (
            failed if failed is not None and failed < fault_at else None)
        if entered is None:
            expected.append(j)
        elif entered >= fault_at - FOLD_WINDOW_S:
            window.append(j)
        elif (j in unfolded and entered >= fault_at - SCHEDULER_LAG_S
              and _entered_once(plans[j], j, obs.ledger, fault_at)
              and any(a < fault_at and b > entered for a, b in obs.late_beats)):
            # still in the fold log at the loss, where it had entered only once, while the
            # supervisor reported its scheduler's beat late (a machine short of CPU);
            # bounded, so a fold that never comes still fails
            window.append(j)
            late_folds.append(fault_at - entered)
        else:
            broken.append(j)
    runs = Counter(len(ok_runs[j]) for j in completed if len(ok_runs[j]) > 1)
    dup_ids = [j for j in completed if len(ok_runs[j]) > 1]
    unexplained = [j for j in dup_ids
                   if any(pid not in obs.killed_pids for pid, _ in ok_runs[j][:-1])]
    firsts = [min(at for _, at in ok_runs[j]) for j in completed]
    during = sum(1 for t in firsts if obs.fault_at and obs.fault_end
                 and obs.fault_at <= t <= obs.fault_end)
    failures = []
    if broken:
        failures.append(f"lost {len(broken)} job(s) the promise covers, e.g. "
                        f"{_sample(broken, plans, first_fail)}")
    if dead:
        failures.append(f"{len(dead)} job(s) dead, e.g. {sorted(dead)[:3]}")
    if dup_ids and not scenario.duplicates_allowed:
        failures.append(f"{len(dup_ids)} job(s) executed more than once")
    if scenario.kills and unexplained:
        failures.append(f"{len(unexplained)} duplicate(s) not explained by a kill, e.g. "
                        f"{unexplained[:3]}")
    gone = set(expected) | set(window)  # lost with Valkey as the dial allows: count completed
    early = [j for j in completed if plans[j].after and any(
        m not in gone and (m not in ok_runs
                           or min(at for _, at in ok_runs[m]) > min(at for _, at in ok_runs[j]))
        for m in plans[j].after)]
    if early:
        failures.append(f"{len(early)} callback(s) ran before all their members completed, "
                        f"e.g. {early[:3]}")
    stall = _longest_stall(obs, plans, ok_runs, first_fail)
    if scenario.name == "floor-outage" and stall > RUNNING_GAP_S:
        failures.append(f"the queue stopped for {stall:.2f}s while the floor was down: no job "
                        "completed although claimable jobs were waiting")
    if not scenario.kills and obs.backoffs:
        failures.append(f"crash loop: {obs.backoffs} respawn backoff(s), "
                        f"{obs.crashes} consumer crash(es)")
    for pid, code in {**obs.expected_exits, **obs.unexpected_exits}.items():
        if code != 0:
            failures.append(f"supervisor {pid} exited {code}"
                            + (" without being asked" if pid in obs.unexpected_exits else ""))
    if not obs.settled and not broken:
        failures.append("the queue did not settle before the deadline")
    notes = list(obs.notes)
    if late_folds:
        notes.append(f"{len(late_folds)} job(s) lost with Valkey had waited in the fold log "
                     f"longer than a beat (up to {max(late_folds):.3f}s before the loss)")
    if scenario.loss_window:
        # a row open at the loss, or about to be (a fold under way took it from the log)
        open_rows = (obs.open_at_loss or set()) | unfolded
        outside, late = [], []
        for j in dup_ids:
            runs_of_j = sorted(ok_runs[j], key=lambda r: r[1])
            if runs_of_j[-1][1] < fault_at:  # run twice before the loss: not the loss's doing
                outside.append(j)
                continue
            for _, at in runs_of_j[:-1]:
                if fault_at - FOLD_WINDOW_S <= at <= (obs.fault_end or fault_at):
                    continue
                # its row still open at the loss: a close later than a beat, as a scheduler
                # short of CPU folds late; bounded, so a close that never comes still fails
                if j in open_rows and fault_at - SCHEDULER_LAG_S <= at < fault_at:
                    late.append(fault_at - at)
                    continue
                outside.append(j)
        if outside:
            failures.append(f"{len(outside)} job(s) run twice although their earlier run "
                            f"ended outside the loss's window, e.g. {outside[:3]}")
        if late:
            notes.append(f"{len(late)} job(s) ran again whose rows closed later than a beat "
                         f"(their runs ended up to {max(late):.3f}s before the loss)")
        twice = [j for j in dup_ids if plans[j].after]
        if twice:
            notes.append(f"{len(twice)} callback(s) ran twice within the loss's window, e.g. "
                         f"{twice[:3]}")
    if scenario.name == "floor-outage" and not obs.events.get("floor-down"):
        notes.append("the supervisor never reported the floor down: was the outage felt?")
    if obs.floor_open:
        notes.append(f"{obs.floor_open} floor row(s) still open after the queue settled")
    recovered = not broken and not dead and bool(firsts) and obs.fault_at is not None
    return {
        "scenario": scenario.name, "floor": obs.floor, "queue": obs.queue, "seed": obs.seed,
        "admitted": len(admitted), "completed": len(completed),
        "lost": len(broken), "lost_immediate": len(expected),
        "lost_in_fold_window": len(window),
        "lost_by_kind": dict(Counter(_kind(plans[j], first_fail) for j in broken)),
        "lost_sample": {j: f"{_kind(plans[j], first_fail)}, admitted "
                           f"{fault_at - admitted[j]:+.3f}s before the fault"
                           + (f", failed {fault_at - first_fail[j]:+.3f}s before"
                              if j in first_fail else "")
                        for j in (broken[:5] + window[:5] + expected[:3])},
        "duplicates": len(dup_ids), "duplicate_runs": {str(k): v for k, v in sorted(runs.items())},
        "dead": len(dead),
        "recovery_s": round(max(firsts) - fault_at, 3) if recovered else None,
        "fault_s": round((obs.fault_end or fault_at) - fault_at, 3),
        "completed_during_fault": during, "longest_stall_s": round(stall, 3),
        "consumers_killed": len(obs.killed_pids),
        "consumer_crashes": obs.crashes, "respawn_backoffs": obs.backoffs,
        "settled": obs.settled, "floor_open_rows": obs.floor_open,
        "producer_retries": obs.producer_errors, "supervisor_events": obs.events,
        "ok": not failures, "failures": failures, "notes": notes, "workdir": obs.workdir,
    }


def _longest_stall(obs: Observation, plans: dict[str, Any],
                   ok_runs: dict[str, list[tuple[int, float]]],
                   fails: dict[str, float]) -> float:
    """The longest stretch of the fault window in which no job completed although some job
    was claimable all along (admitted, due, out of its retry backoff, not yet done)."""
    if obs.fault_at is None or obs.fault_end is None:
        return 0.0
    done = {j: min(at for _, at in runs) for j, runs in ok_runs.items()}
    ready = []
    for j, at in obs.admitted_at.items():
        since = at + (plans[j].delay or 0.0)
        if j in fails:
            since = max(since, fails[j] + RETRY_SLACK_S)
        ready.append((since, done.get(j, float("inf"))))
    marks = sorted({obs.fault_at, obs.fault_end,
                    *(t for t in done.values() if obs.fault_at < t < obs.fault_end)})
    longest = 0.0
    for a, b in zip(marks, marks[1:], strict=False):
        for since, end in ready:
            if since < b <= end:  # claimable before b, still not done at b
                longest = max(longest, b - max(a, since))
    return longest


def _kind(plan: Any, fails: dict[str, float]) -> str:
    if plan.delay:
        return "deferred"
    return "retried" if plan.id in fails else "immediate"


def _entered_once(plan: JobPlan, job_id: str, ledger: list[tuple[str, int, int, str, float]],
                  fault_at: float) -> bool:
    """Whether a job lost with Valkey entered the fold log once only before the loss: a
    deferred job that had not run, or an immediate one that had failed once. A callback
    enters again at each member's end, a deferred job again at its retry: a later entry
    would hide an earlier one that a fold missed."""
    if plan.after:
        return False
    runs = [r for r in ledger if r[0] == job_id and r[4] < fault_at]
    return len(runs) == (0 if plan.delay else 1)


def _sample(ids: list[str], plans: dict[str, Any], fails: dict[str, float]) -> str:
    return ", ".join(f"{j} ({_kind(plans[j], fails)})" for j in ids[:3])


# --- output ------------------------------------------------------------------------------

COLUMNS = (("scenario", 24), ("floor", 10), ("admitted", 8), ("completed", 9), ("lost", 9),
           ("duplicates", 14), ("dead", 4), ("recovery_s", 10), ("result", 6))


def _cell(report: dict[str, Any], name: str) -> str:
    if name == "result":
        return "ok" if report.get("ok") else "FAIL"
    if name == "lost":
        extra = "".join(f"+{report[k]}{mark}" for k, mark in
                        (("lost_immediate", "*"), ("lost_in_fold_window", "~")) if report.get(k))
        return f"{report.get('lost', '-')}{extra}"
    if name == "duplicates" and report.get("duplicate_runs"):
        runs = ", ".join(f"{k}x{v}" for k, v in report["duplicate_runs"].items())
        return f"{report['duplicates']} ({runs})"
    value = report.get(name)
    return "-" if value is None else str(value)


def table(reports: list[dict[str, Any]]) -> str:
    """The drill reports as a text table, with footnotes for expected losses."""
    head = "  ".join(name.ljust(width) for name, width in COLUMNS)
    lines = [head, "  ".join("-" * width for _, width in COLUMNS)]
    for r in reports:
        lines.append("  ".join(_cell(r, name).ljust(width) for name, width in COLUMNS))
    if any(r.get("lost_immediate") for r in reports):
        lines.append("* lost_immediate (expected: Valkey lost its data): immediate jobs that "
                     "were waiting when the server restarted empty")
    if any(r.get("lost_in_fold_window") for r in reports):
        lines.append("~ deferred, retried or blocked less than one beat before Valkey lost its "
                     "data, or waiting in the fold log for a late scheduler's turn (not yet "
                     "folded: the dial allows this window)")
    for r in reports:
        for failure in r.get("failures", []):
            lines.append(f"{r['scenario']}: FAIL {failure}")
        for note in r.get("notes", []):
            lines.append(f"{r['scenario']}: note {note}")
        if r.get("workdir"):
            lines.append(f"{r['scenario']}: logs and ledger kept in {r['workdir']}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """The ``drill`` subcommand: args has scenario, jobs, processes, floor_url, report."""
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or args.jobs < 1 or args.processes < 1:
        problem = (f"unknown scenario {unknown[0]!r}; choose one of all, {', '.join(SCENARIOS)}"
                   if unknown else "--jobs and --processes must be >= 1")
        print(f"echomq-supervisor drill: {problem}", file=sys.stderr)
        return 2
    floor_url = args.floor_url or os.environ.get("ECHOMQ_FLOOR_URL") or None
    reports = []
    for name in names:
        reports.append(run_scenario(name, args.jobs, args.processes, floor_url,
                                    doorbell=getattr(args, "doorbell", "list")))
        if args.report == "table" and len(names) > 1:
            print(f"{name}: {'ok' if reports[-1]['ok'] else 'FAIL'}", file=sys.stderr)
    if args.report == "json":
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    else:
        print(table(reports))
    return 0 if all(r["ok"] for r in reports) else 1
