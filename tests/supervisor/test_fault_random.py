"""The randomized fault test: the delivery promise under a storm of faults, judged from a ledger.

One run (shared by the tests below, each asserting one part of the promise): an
AOF-backed server (``appendfsync always``), a supervisor with 4 consumer processes,
a few thousand jobs over many lanes (fast, slow, failing, flaky, and handlers that
``os._exit`` mid-job, with the boot-failure code 3 among their codes), while a
driver SIGKILLs consumers, SIGTERMs the supervisor and starts a new one, and
SIGKILLs the server and starts it again on its append-only file. The handler
records every run's start and end in a SQLite ledger outside the server.

``ECHOMQ_FAULT_SECONDS`` sets how long faults are injected (default 35: the whole
run stays near 60-90 s in CI; 600 for the ten-minute run). ``ECHOMQ_FAULT_SEED``
replays a run: the seed picks the jobs and the driver's faults and their timing.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from echomq.supervisor.drills.handler import LEDGER_ENV, NOTIFY_ENV
from echomq.supervisor.drills.harness import CLI, Doorbell, Ledger, SupervisorProc
from echomq.supervisor.drills.localredis import LocalRedis, server_binary

from echomq.errors import EchoMQError
from echomq.queue import Queue

FAULT_S = float(os.environ.get("ECHOMQ_FAULT_SECONDS", "35"))
SEED = int(os.environ.get("ECHOMQ_FAULT_SEED") or random.randrange(1 << 30))
PROCESSES = 4
LANES = 64
JOBS = max(200, int(FAULT_S * 60))
PRODUCE_SHARE = 0.6  # admits are spread over this share of the fault window
BEAT_MS = 200
LEASE_MS = 2000
DRAIN_S = 10.0
MAX_ATTEMPTS = 3  # the defaults: what users run
MAX_STALLS = 1
BACKOFF_S = 0.05
SETTLE_S = 60.0 + FAULT_S / 5
CHECK_S = 0.25  # "every job finished" is an absence: re-checked on this beat
HANDLER = "echomq.supervisor.drills.handler:handle"
MIX = (  # kind, share
    ("fast", 0.69), ("slow", 0.08), ("flaky", 0.10), ("failing", 0.04),
    ("exit_first", 0.075), ("exit_always", 0.015),
)
EXIT_CODES = (1, 3, 9)
# the whole run happens in the first test's setup: its bound grows with the fault window
pytestmark = pytest.mark.timeout(int(120 + 1.5 * FAULT_S + 2 * SETTLE_S))


@dataclass(frozen=True)
class Planned:
    id: str
    kind: str
    lane: str
    payload: dict[str, Any]


def make_plan(rng: random.Random, queue: str) -> list[Planned]:
    kinds, weights = zip(*MIX, strict=True)
    plan = []
    for i in range(JOBS):
        kind = rng.choices(kinds, weights)[0]
        payload: dict[str, Any] = {"trace": True, "work_ms": rng.uniform(0.5, 4)}
        if kind == "slow":
            payload["work_ms"] = rng.uniform(100, 500)
        elif kind == "flaky":
            payload["fail_first"] = True
        elif kind == "failing":
            payload["fail_always"] = True
        elif kind in ("exit_first", "exit_always"):
            payload[kind] = rng.choice(EXIT_CODES)
        plan.append(Planned(f"{queue}-{i:06d}", kind, f"lane-{rng.randrange(LANES)}", payload))
    return plan


class Producer(threading.Thread):
    """Admits the plan in paced batches; a batch that meets a restarting server is retried
    (admit is idempotent per job id)."""

    def __init__(self, url: str, queue: str, plan: list[Planned], over_s: float) -> None:
        super().__init__(name="fault-producer", daemon=True)
        self.queue = Queue(queue, redis_url=url, max_attempts=MAX_ATTEMPTS,
                           max_stalls=MAX_STALLS)
        self.plan, self.over_s = plan, over_s
        self.halt = threading.Event()
        self.admitted: set[str] = set()
        self.retries = 0

    def run(self) -> None:
        batches = 50
        size = max(1, -(-len(self.plan) // batches))
        start = time.monotonic()
        for n, i in enumerate(range(0, len(self.plan), size)):
            # pacing, not polling: the wait ends at this batch's slot or on halt
            if self.halt.wait(max(0.0, start + n * self.over_s / batches - time.monotonic())):
                return
            batch = self.plan[i:i + size]
            jobs = [("fault", p.payload, {"job_id": p.id, "lane": p.lane, "backoff": BACKOFF_S})
                    for p in batch]
            while not self.halt.is_set():
                try:
                    self.queue.add_many(jobs)
                except (EchoMQError, OSError):
                    self.retries += 1
                    self.halt.wait(CHECK_S)  # no event says the server is back: try again
                    continue
                self.admitted.update(p.id for p in batch)
                break
        self.queue.close()


@dataclass
class Run:
    """What one run did and saw; the tests judge it."""

    seed: int
    workdir: Path
    plan: dict[str, Planned] = field(default_factory=dict)
    admitted: set[str] = field(default_factory=set)
    ledger: list[tuple[str, int, int, str, float]] = field(default_factory=list)
    dead: dict[str, str] = field(default_factory=dict)  # id -> error
    counts: dict[str, int] = field(default_factory=dict)
    killed: set[int] = field(default_factory=set)  # consumer pids the driver SIGKILLed
    actions: Counter[str] = field(default_factory=Counter)
    exits: list[int | None] = field(default_factory=list)  # supervisors' codes on SIGTERM
    unasked: list[str] = field(default_factory=list)
    settled: bool = False
    producer_retries: int = 0

    def where(self) -> str:
        return f"(replay: ECHOMQ_FAULT_SEED={self.seed}; logs and ledger in {self.workdir})"


class Driver:
    """The faults, in an order and at times drawn from the seed."""

    def __init__(self, rng: random.Random, server: LocalRedis, run: Run,
                 start_supervisor: Any) -> None:
        self.rng, self.server, self.run = rng, server, run
        self.start_supervisor = start_supervisor
        self.current: SupervisorProc = start_supervisor()

    def drive(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        first = ["kill_child", "restart_supervisor", "restart_server"]
        self.rng.shuffle(first)  # each kind at least once, early
        while time.monotonic() < end:
            action = first.pop() if first else self.rng.choices(
                ["kill_child", "restart_supervisor", "restart_server"], [6, 1, 1])[0]
            getattr(self, action)()
            self.run.actions[action] += 1
            self.wait_exit_that_should_not_come(self.rng.uniform(0.2, 1.5))

    def wait_exit_that_should_not_come(self, seconds: float) -> None:
        """Let the system run: a wait on the supervisor's exit, which must not come."""
        code = self.current.wait(seconds)
        if code is not None:
            self.run.unasked.append(f"supervisor {self.current.pid} exited {code} unasked; "
                                    f"log {self.current.log_path}")
            self.current = self.start_supervisor()

    def kill_child(self) -> None:
        kids = self.current.children()
        if kids:
            pid = self.rng.choice(kids)
            self.run.killed.add(pid)  # before the kill: its runs may end any moment now
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def restart_supervisor(self) -> None:
        self.current.terminate()
        self.run.exits.append(self.current.wait(DRAIN_S + 20))
        if self.run.exits[-1] is None:
            self.run.killed.update(self.current.kill_tree())
        self.current = self.start_supervisor()

    def restart_server(self) -> None:
        self.server.kill()  # SIGKILL: only what the append-only file holds survives
        threading.Event().wait(self.rng.uniform(0.2, 2.5))  # the outage's length
        self.server.start()

    def stop(self) -> None:
        self.current.terminate()
        self.run.exits.append(self.current.wait(DRAIN_S + 20))


def _finished(run: Run, ledger: Ledger, q: Queue) -> bool:
    done = ledger.done_ids()
    dead = {j.id for j in q.dead(limit=len(run.plan) + 1)}
    if not run.admitted <= done | dead:
        return False
    c = q.counts()
    return c["waiting"] == c["scheduled"] == c["active"] == 0


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    if server_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("the fault test needs a redis-server/valkey-server binary")
        pytest.skip("the fault test needs a redis-server/valkey-server binary")
    rng = random.Random(SEED)
    print(f"\nrandomized fault test: ECHOMQ_FAULT_SEED={SEED} ECHOMQ_FAULT_SECONDS={FAULT_S}",
          file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="echomq-fault-"))
    result = Run(seed=SEED, workdir=workdir)
    queue = f"fault-{rng.randrange(1 << 32):08x}"
    plan = make_plan(rng, queue)
    result.plan = {p.id: p for p in plan}
    (workdir / "redis").mkdir()
    server = LocalRedis(appendonly=True, workdir=str(workdir / "redis"),
                        extra_args=("--appendfsync", "always")).start()
    ledger = Ledger(workdir / "ledger.db")
    doorbell = Doorbell(workdir / "notify.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env[LEDGER_ENV] = str(workdir / "ledger.db")
    env[NOTIFY_ENV] = str(workdir / "notify.sock")
    started: list[SupervisorProc] = []

    def start_supervisor() -> SupervisorProc:
        n = len(started)
        cmd = [*CLI, "start", "--redis-url", server.url, "--queue", queue, "--handler", HANDLER,
               "--processes", str(PROCESSES), "--beat-ms", str(BEAT_MS), "--lease-ms",
               str(LEASE_MS), "--drain-timeout", str(DRAIN_S), "--log-json"]
        sup = SupervisorProc(n, cmd, env, workdir / f"supervisor-{n}.log")
        started.append(sup)
        if not sup.wait_started():
            result.unasked.append(f"supervisor {n} did not start; log {sup.log_path}")
        return sup

    producer = Producer(server.url, queue, plan, FAULT_S * PRODUCE_SHARE)
    probe = Queue(queue, redis_url=server.url)
    try:
        driver = Driver(rng, server, result, start_supervisor)
        producer.start()
        driver.drive(FAULT_S)
        producer.join(timeout=SETTLE_S)
        result.admitted = set(producer.admitted)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            try:
                if _finished(result, ledger, probe):
                    result.settled = True
                    break
            except (EchoMQError, OSError):
                pass
            doorbell.wait(CHECK_S)  # woken by a success; the re-check covers the rest
        driver.stop()
        result.ledger = ledger.rows()
        result.dead = {j.id: j.error or "" for j in probe.dead(limit=len(plan) + 1)}
        result.counts = probe.counts()
        result.producer_retries = producer.retries
        yield result
    finally:
        producer.halt.set()
        producer.join(timeout=15)
        for sup in started:
            sup.finish()
        probe.close()
        doorbell.close()
        ledger.close()
        server.stop()
    print(f"\n{figures(result)}", file=sys.stderr)
    if request.session.testsfailed == 0:  # kept for the replay when anything failed
        shutil.rmtree(workdir, ignore_errors=True)


# --- reading the ledger ------------------------------------------------------------------


def _runs(run: Run) -> dict[str, dict[tuple[int, int], set[str]]]:
    """job -> (attempt, pid) -> the kinds recorded for that run (start, ok, fail)."""
    out: dict[str, dict[tuple[int, int], set[str]]] = {}
    for job_id, attempt, pid, kind, _ in run.ledger:
        out.setdefault(job_id, {}).setdefault((attempt, pid), set()).add(kind)
    return out


def _died_mid_job(run: Run) -> set[int]:
    """Consumer pids that died with a job in hand: SIGKILLed by the driver, or taken down
    by a handler's ``os._exit``."""
    pids = set(run.killed)
    for job_id, attempt, pid, kind, _ in run.ledger:
        plan = run.plan.get(job_id)
        if kind == "start" and plan is not None and (
                "exit_always" in plan.payload or ("exit_first" in plan.payload and attempt <= 1)):
            pids.add(pid)
    return pids


def _ok_runs(run: Run) -> dict[str, list[int]]:
    ok: dict[str, list[int]] = {}
    for job_id, _, pid, kind, _ in run.ledger:
        if kind == "ok":
            ok.setdefault(job_id, []).append(pid)
    return ok


def figures(run: Run) -> str:
    ok = _ok_runs(run)
    dup = sum(1 for pids in ok.values() if len(pids) > 1)
    lost = len(run.admitted - set(ok) - set(run.dead))
    return (f"fault run seed={run.seed}: {dict(run.actions)}, consumers killed "
            f"{len(run.killed)}, jobs {len(run.plan)} admitted {len(run.admitted)}, completed "
            f"{len(set(ok))}, dead {len(run.dead)}, lost {lost}, duplicates {dup}, "
            f"wrongly dead {len(_wrongly_dead(run))}, producer retries {run.producer_retries}, "
            f"settled {run.settled}")


def _killed_before_the_ledger(run: Run) -> Counter[str]:
    """Stalls of runs the driver's SIGKILL ended before their handler wrote its ``start``
    row (the consumer had begun the job; the handler's first ledger write takes a few ms):
    the supervisor's log names the job each killed consumer was charged for."""
    recorded = {(job_id, pid) for job_id, _, pid, kind, _ in run.ledger if kind == "start"}
    unseen: Counter[str] = Counter()
    for path in run.workdir.glob("supervisor-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") != "child-exit" or entry.get("pid") not in run.killed:
                continue
            unseen.update(job_id for job_id in entry.get("stalled") or ()
                          if (job_id, entry["pid"]) not in recorded)
    return unseen


def _wrongly_dead(run: Run) -> dict[str, str]:
    """Dead jobs whose handler neither failed out nor stalled enough to be buried."""
    runs = _runs(run)
    unseen = _killed_before_the_ledger(run)
    wrong = {}
    for job_id, error in run.dead.items():
        plan = run.plan[job_id]
        if plan.kind == "failing":
            continue  # it fails on every attempt: dead is its due
        mine = runs.get(job_id, {})
        unfinished = sum(1 for kinds in mine.values() if kinds == {"start"}) + unseen[job_id]
        fails = sum(1 for kinds in mine.values() if "fail" in kinds)
        if unfinished >= MAX_STALLS + 1 or (fails and len(mine) >= MAX_ATTEMPTS):
            continue
        wrong[job_id] = (f"{plan.kind}: {len(mine)} run(s), {unfinished} unfinished, "
                         f"{fails} failed; {error[:120]}")
    return wrong


# --- the promise ---------------------------------------------------------------------------


def test_the_run_drove_every_kind_of_fault(run: Run) -> None:
    assert run.actions["kill_child"] and run.actions["restart_supervisor"] and \
        run.actions["restart_server"], figures(run)
    assert len(run.admitted) == len(run.plan), figures(run) + run.where()
    assert not run.unasked, f"{run.unasked} {run.where()}"
    assert all(code == 0 for code in run.exits), f"SIGTERM exits {run.exits} {run.where()}"


def test_every_job_completed_or_dead(run: Run) -> None:
    ok = _ok_runs(run)
    lost = sorted(run.admitted - set(ok) - set(run.dead))
    assert not lost, (f"{len(lost)} job(s) neither completed nor dead, e.g. "
                      f"{[(j, run.plan[j].kind) for j in lost[:5]]}; {figures(run)} {run.where()}")
    assert run.settled, figures(run) + run.where()


def test_no_job_dead_whose_handler_did_not_fail_or_stall(run: Run) -> None:
    wrong = _wrongly_dead(run)
    assert not wrong, (f"{len(wrong)} job(s) dead without cause, e.g. "
                       f"{dict(list(wrong.items())[:4])}; {figures(run)} {run.where()}")


def test_duplicates_only_for_jobs_in_flight_at_a_kill(run: Run) -> None:
    died = _died_mid_job(run)
    unexplained = {j: pids for j, pids in _ok_runs(run).items()
                   if len(pids) > 1 and any(pid not in died for pid in pids[:-1])}
    assert not unexplained, (f"{len(unexplained)} job(s) completed more than once by "
                             f"consumers that did not die mid-job, e.g. "
                             f"{dict(list(unexplained.items())[:4])}; {figures(run)} "
                             f"{run.where()}")


def test_counts_agree_with_the_ledger(run: Run) -> None:
    completed = set(_ok_runs(run)) - set(run.dead)
    expected = {"waiting": 0, "scheduled": 0, "active": 0, "completed": len(completed),
                "dead": len(run.dead), "cancelled": 0}
    assert run.counts == expected, f"{run.counts} != {expected}; {figures(run)} {run.where()}"

