"""The drills' harness: a private server, a floor, real supervisors, a producer, a ledger.

:mod:`echomq.supervisor.drills.scenarios` holds the scenarios; this module holds what
they share. A :class:`Harness` starts its own redis-server (:class:`LocalRedis`),
migrates the floor, starts ``echomq-supervisor start`` subprocesses with the drill
handler, runs a paced producer thread, waits for progress and for the queue to settle,
and gathers the facts a report is computed from (:class:`Observation`).

Waiting is done on events: the supervisor's log pipe (its start line), process
exits (``Popen.wait`` / pidfd), and a unix datagram "doorbell" the handler rings
after each recorded success. Where no event exists (the queue being *empty* is
an absence, and a SQLite file written by other processes has no change
notification), the harness re-checks on a bounded beat, as the metronome does.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from echomq.supervisor.drills.handler import LEDGER_ENV, NOTIFY_ENV, open_ledger
from echomq.supervisor.drills.localcluster import LocalCluster
from echomq.supervisor.drills.localredis import LocalRedis
from echomq.supervisor.drills.supervisorproc import SupervisorProc

from echomq.errors import EchoMQError, FloorError
from echomq.floor import Floor
from echomq.keys import Keys
from echomq.queue import Queue

CLI = [sys.executable, "-m", "echomq.supervisor.cli"]
HANDLER = "echomq.supervisor.drills.handler:handle"
BEAT_MS = 200
LEASE_MS = 2000
DRAIN_S = 10.0
LANES = 24
WORK_MS = 5
DELAYED_SHARE = 0.3
DELAY_RANGE_S = (0.2, 2.0)
FAIL_FIRST_SHARE = 0.25
CHORD_SIZE = 10  # the workflow drill: 9 members and a callback waiting for them
RETRY_BACKOFF_S = 0.2
MAX_ATTEMPTS = 10  # a killed attempt counts; the drills' kills must not bury jobs
MAX_STALLS = 10
PRODUCE_S = 2.0  # the producer spreads its admits over this long
PRODUCE_BATCHES = 20
CHECK_S = 0.25  # the bounded re-check beat where no event exists
SETTLE_TIMEOUT_S = 25.0
HOLD_MS = 30_000  # the writes held before a restart: the restart ends the pause sooner
QUIET_S = 1.0  # "drained" must hold this long: a rehydrate or a reap may still be coming
CLOSE_WAIT_S = 3.0  # after the last job, how long the floor gets to close its rows


@dataclass(frozen=True)
class JobPlan:
    """One job the producer will admit."""

    id: str
    lane: str
    delay: float | None
    fail_first: bool
    after: tuple[str, ...] = ()  # a chord's callback: the members it waits for


def make_plan(n: int, tag: str, rng: random.Random, chord: int = 0) -> list[JobPlan]:
    """A mix of immediate, delayed and fail-once jobs across many lanes. With ``chord``,
    every chord-th job is a callback waiting for the chord - 1 jobs before it."""
    plan = []
    for i in range(n):
        after = tuple(p.id for p in plan[-(chord - 1):]) if chord and i % chord == chord - 1 \
            else ()
        delay = round(rng.uniform(*DELAY_RANGE_S), 3) if rng.random() < DELAYED_SHARE else None
        plan.append(JobPlan(id=f"{tag}-{i:06d}", lane=f"lane-{rng.randrange(LANES)}",
                            delay=None if after else delay,
                            fail_first=rng.random() < FAIL_FIRST_SHARE, after=after))
    return plan


class Producer(threading.Thread):
    """Admits the plan in paced batches; retries a batch (admit is idempotent per id) while
    the server is unreachable, and records when each job's admit returned."""

    def __init__(self, redis_url: str, queue: str, plan: list[JobPlan],
                 durability: str | None = None, floor_url: str | None = None) -> None:
        super().__init__(name="drill-producer", daemon=True)
        # "sync": deferred jobs reach the floor before add_many returns, so it needs one
        self.floor = Floor.from_url(floor_url) if floor_url else None
        self.queue = Queue(queue, redis_url=redis_url, max_attempts=MAX_ATTEMPTS,
                           max_stalls=MAX_STALLS, durability=durability, floor=self.floor)
        self.plan = plan
        self._admitted_at: dict[str, float] = {}
        self._sent_at: dict[str, float] = {}  # when the admit that landed was sent
        self._lock = threading.Lock()
        self.errors = 0
        self.halt = threading.Event()

    def run(self) -> None:
        """Admit the plan in paced batches until done or halted, recording admit times."""
        size = max(1, -(-len(self.plan) // PRODUCE_BATCHES))
        if any(p.after for p in self.plan):  # a chord is admitted whole, in one call
            size = -(-size // CHORD_SIZE) * CHORD_SIZE
        pace = PRODUCE_S / PRODUCE_BATCHES
        start = time.monotonic()
        try:
            for n, i in enumerate(range(0, len(self.plan), size)):
                # pacing, not polling: the wait ends at this batch's slot or on halt
                if self.halt.wait(max(0.0, start + n * pace - time.monotonic())):
                    return
                self._admit(self.plan[i:i + size])
        finally:
            self.queue.close()
            if self.floor is not None:
                self.floor.dispose()

    def admitted(self) -> dict[str, float]:
        """A copy of job id -> time its admit returned, safe to read while producing."""
        with self._lock:
            return dict(self._admitted_at)

    def sent(self) -> dict[str, float]:
        """A copy of job id -> time the admit that landed was sent (it reached the server
        at some moment between this and :meth:`admitted`'s time)."""
        with self._lock:
            return dict(self._sent_at)

    def _admit(self, batch: list[JobPlan]) -> None:
        jobs = [("drill", {"work_ms": WORK_MS, "fail_first": p.fail_first},
                 {"job_id": p.id, "lane": p.lane, "delay": p.delay, "backoff": RETRY_BACKOFF_S,
                  **({"after": list(p.after)} if p.after else {})})
                for p in batch]
        while not self.halt.is_set():
            sent = time.time()
            try:
                self.queue.add_many(jobs)
            except (EchoMQError, OSError):
                self.errors += 1
                # no event says "the server is back"; a new attempt is the only probe
                self.halt.wait(CHECK_S)
                continue
            now = time.time()
            with self._lock:
                self._admitted_at.update((p.id, now) for p in batch)
                self._sent_at.update((p.id, sent) for p in batch)
            return


class Doorbell:
    """A unix datagram socket the handler rings after each success."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)

    def wait(self, timeout: float) -> bool:
        """Block until a ring or the timeout; swallow every ring already queued."""
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        rung = False
        while ready:
            try:
                self.sock.recv(64)
                rung = True
            except BlockingIOError:
                break
        return rung

    def close(self) -> None:
        """Close the doorbell's socket."""
        self.sock.close()


class Ledger:
    """The drill's read side of the handler's ledger."""

    def __init__(self, path: Path) -> None:
        self.path = path
        open_ledger(str(path)).close()  # create the file and table before anyone writes
        self.conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)

    def done_ids(self) -> set[str]:
        """Ids of every job whose handler completed at least once."""
        return {r[0] for r in self.conn.execute(
            "SELECT DISTINCT job_id FROM executions WHERE kind = 'ok'")}

    def rows(self) -> list[tuple[str, int, int, str, float]]:
        """Every recorded execution: (job id, attempt, pid, kind, time), oldest first."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT job_id, attempt, pid, kind, at FROM executions ORDER BY at")]

    def close(self) -> None:
        """Close the ledger's database."""
        self.conn.close()


@dataclass
class Observation:
    """The raw facts of one drill run, before any judgement."""

    scenario: str
    floor: str
    queue: str
    seed: int
    plan: list[JobPlan]
    admitted_at: dict[str, float] = field(default_factory=dict)
    sent_at: dict[str, float] = field(default_factory=dict)  # the landed admit's sending
    ledger: list[tuple[str, int, int, str, float]] = field(default_factory=list)
    dead_ids: set[str] = field(default_factory=set)
    fault_at: float | None = None
    fault_end: float | None = None
    settled: bool = False
    killed_pids: set[int] = field(default_factory=set)
    expected_exits: dict[int, int | None] = field(default_factory=dict)
    unexpected_exits: dict[int, int | None] = field(default_factory=dict)
    crashes: int = 0
    backoffs: int = 0
    events: dict[str, int] = field(default_factory=dict)
    floor_open: int | None = None
    open_at_loss: set[str] | None = None  # the queue's floor rows as Valkey lost its data
    unfolded_at_loss: set[str] | None = None  # its fold log then: not yet on the floor
    late_beats: list[tuple[float, float]] = field(default_factory=list)  # reported late
    producer_errors: int = 0
    notes: list[str] = field(default_factory=list)
    workdir: str = ""


class Harness:
    """One drill run's processes and files. Use as a context manager."""

    def __init__(self, scenario: str, jobs: int, processes: int, floor_url: str | None,
                 seed: int | None = None, doorbell_kind: str = "list") -> None:
        self.doorbell_kind = doorbell_kind  # what the supervisors park on: list or marker
        self.workdir = Path(tempfile.mkdtemp(prefix=f"echomq-drill-{scenario}-"))
        self.jobs = jobs
        self.processes = processes
        self.owned_floor_dir: Path | None = None
        if floor_url is None:
            self.owned_floor_dir = self.workdir / "floor"
            self.owned_floor_dir.mkdir()
            floor_url = f"sqlite:///{self.owned_floor_dir / 'floor.db'}"
        self.floor_url = floor_url
        self.seed = seed if seed is not None else random.randrange(1 << 30)
        self.queue = f"drill-{uuid.uuid4().hex[:8]}"  # a shared floor never mixes two runs
        self.plan = make_plan(jobs, self.queue, random.Random(self.seed),
                              CHORD_SIZE if scenario.startswith("workflow") else 0)
        self.obs = Observation(scenario=scenario, floor=floor_url.split(":", 1)[0].split("+")[0],
                               queue=self.queue, seed=self.seed, plan=self.plan,
                               workdir=str(self.workdir))
        # a cluster drill runs on a 3-master, 3-replica cluster; the others on one server
        self.cluster = LocalCluster() if scenario.startswith("cluster") else None
        self.redis: Any = self.cluster or LocalRedis(workdir=str(self.workdir / "redis"))
        self.supervisors: list[SupervisorProc] = []
        self.doorbell: Doorbell | None = None
        self.ledger: Ledger | None = None
        self.producer: Producer | None = None
        self._floor: Any = None
        self._probe: Queue | None = None
        self.durability: str | None = None  # the supervisor's and the producer's dial
        self.outbox_url: str | None = None  # --outbox-url (the outbox drills' app database)
        self.extra_admitted: dict[str, float] = {}  # jobs admitted by the fault (the outbox)

    # --- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> Harness:
        try:
            Path(self.redis.workdir).mkdir(parents=True, exist_ok=True)
            self.redis.start()
            if self.cluster is not None:  # the drill kills this queue's master
                self.cluster.enter_away_from(f"emq:{{{self.queue}}}:wake")
            self.ledger = Ledger(self.workdir / "ledger.db")
            self.doorbell = Doorbell(self.workdir / "notify.sock")
            self.migrate()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.producer is not None:
            self.producer.halt.set()
            self.producer.join(timeout=15)
        for sup in self.supervisors:
            sup.finish()
        for closer in (self.doorbell, self.ledger):
            if closer is not None:
                closer.close()
        if self._floor is not None:
            self._floor.dispose()
        if self._probe is not None:
            self._probe.close()
        self.redis.stop()

    def cleanup(self) -> None:
        """Remove the drill's working directory."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def migrate(self) -> None:
        """Run `echomq-supervisor migrate` on the drill's floor; RuntimeError if it fails."""
        done = subprocess.run([*CLI, "migrate", "--floor-url", self.floor_url],
                              capture_output=True, text=True, timeout=120,
                              env=self._env(), stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed ({done.returncode}): {done.stderr.strip()}")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
        env[LEDGER_ENV] = str(self.workdir / "ledger.db")
        env[NOTIFY_ENV] = str(self.workdir / "notify.sock")
        return env

    def start_supervisor(self, wait: bool = True) -> SupervisorProc:
        """Start one more supervisor on the drill's queue (waiting for its start)."""
        n = len(self.supervisors)
        cmd = [*CLI, "start", "--redis-url", self.redis.url, "--queue", self.queue,
               "--handler", HANDLER, "--processes", str(self.processes),
               "--floor-url", self.floor_url, "--beat-ms", str(BEAT_MS),
               "--lease-ms", str(LEASE_MS), "--drain-timeout", str(DRAIN_S), "--log-json",
               "--doorbell", self.doorbell_kind]
        if self.durability:
            cmd += ["--durability", self.durability]
        if self.outbox_url:
            cmd += ["--outbox-url", self.outbox_url]
        sup = SupervisorProc(n, cmd, self._env(), self.workdir / f"supervisor-{n}.log")
        self.supervisors.append(sup)
        if wait and not sup.wait_started():
            raise RuntimeError(f"supervisor {n} did not start: see {sup.log_path}:\n"
                               + _tail(sup.log_path))
        return sup

    @property
    def current(self) -> SupervisorProc:
        """The most recently started supervisor."""
        return self.supervisors[-1]

    def start_producer(self) -> Producer:
        """Start admitting the plan in the background."""
        # on a cluster, admits wait for a replica (durability "sync"): a failover loses none
        sync = self.cluster is not None
        dial = "sync" if sync else self.durability  # "durable": every job on the floor
        self.producer = Producer(self.redis.url, self.queue, self.plan, dial,
                                 self.floor_url if dial in ("sync", "durable") else None)
        self.producer.start()
        return self.producer

    # --- waiting ------------------------------------------------------------------------

    def wait_progress(self, fraction: float, timeout: float = 20.0) -> None:
        """Return once ``fraction`` of the plan has completed: work is in flight."""
        assert self.ledger is not None and self.doorbell is not None
        target = max(1, int(len(self.plan) * fraction))
        deadline = time.monotonic() + timeout
        while len(self.ledger.done_ids()) < target:
            self._check_alive()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no progress: fewer than {target} jobs done in {timeout}s; "
                                   f"see {self.current.log_path}:\n" + _tail(self.current.log_path))
            # woken by the handler's doorbell; the bounded re-check covers a ring that was
            # dropped (a datagram is best effort) and a supervisor that died
            self.doorbell.wait(min(left, CHECK_S))

    def wait_settled(self, timeout: float = SETTLE_TIMEOUT_S) -> bool:
        """Until every admitted job is done, or the queue has nothing left anywhere."""
        assert self.ledger is not None and self.doorbell is not None
        assert self.producer is not None
        self.producer.join(timeout=timeout)
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        done_since: float | None = None
        while (now := time.monotonic()) < deadline:
            self._check_alive()
            producing = self.producer.is_alive()
            admitted = self.producer.admitted().keys() | self.extra_admitted.keys()
            all_done = not producing and self.ledger.done_ids() >= admitted
            # "nothing left" is an absence, so no event announces it: re-check each beat
            drained = not producing and self._drained()
            if all_done and drained:
                return True
            if all_done:  # the floor rows of finished jobs close a beat or two later
                done_since = done_since or now
                if now - done_since >= CLOSE_WAIT_S:
                    return True
            if drained:
                quiet_since = quiet_since or now
                if now - quiet_since >= QUIET_S:
                    return True
            else:
                quiet_since = None
            self.doorbell.wait(min(CHECK_S, max(0.0, deadline - time.monotonic())))
        return False

    def _drained(self) -> bool:
        if self._probe is None:
            self._probe = Queue(self.queue, redis_url=self.redis.url)
        try:
            c = self._probe.counts()
            if c["waiting"] or c["scheduled"] or c["active"]:
                return False
            return self.floor_open() == 0
        except (EchoMQError, OSError):
            return False

    def floor_open(self) -> int | None:
        """Open floor rows of this run's queue; None when the floor does not answer."""
        from echomq.floor import Floor

        if self._floor is None:
            self._floor = Floor.from_url(self.floor_url)
        try:
            return int(self._floor.count(self.queue))
        except FloorError:
            return None

    def floor_ids(self) -> set[str]:
        """The ids of this run's queue's floor rows, read in one pass (pages of 1,000)."""
        from echomq.floor import Floor

        if self._floor is None:
            self._floor = Floor.from_url(self.floor_url)
        ids: set[str] = set()
        after = None
        while rows := self._floor.open_rows(self.queue, after, 1000):
            ids.update(r.job_id for r in rows)
            after = rows[-1].job_id
        return ids

    def hold_writes_for_loss(self) -> None:
        """Valkey is about to lose its data: hold every write there from now (CLIENT PAUSE
        WRITE holds scripts too, so no job is admitted, settled or trimmed from the fold
        log) and note what the floor is owed at this moment: the fold log, the jobs that
        entered the schedule and were not written to the floor yet. The loss is stamped
        (``fault_at``) as the pause holds. The restart that follows ends the pause."""
        self.obs.fault_at = time.time()  # stamped again as the pause holds
        client = redis.Redis.from_url(self.redis.url, socket_timeout=10)
        try:
            client.ping()  # connected first: the loss begins with the pause, not before
            client.client_pause(HOLD_MS, all=False)
            # an admit sent from now on is held, then fails with the restart and is sent
            # again: only one sent before may have landed on the server that loses its data
            self.obs.fault_at = time.time()
            self.obs.unfolded_at_loss = {
                x.decode() for x in client.lrange(Keys(self.queue).fold, 0, -1)}
        finally:
            client.close()

    def _check_alive(self) -> None:
        for sup in self.supervisors:
            code = sup.proc.poll()
            if code is not None and sup.signalled is None and sup.pid not in \
                    self.obs.unexpected_exits:
                self.obs.unexpected_exits[sup.pid] = code
                self.obs.notes.append(f"supervisor {sup.pid} exited {code} unasked; "
                                      f"log {sup.log_path}")

    def pause(self, seconds: float) -> None:
        """Let a fault last: wait on the current supervisor's exit, which should not come."""
        code = self.current.wait(seconds)
        if code is not None:
            self._check_alive()

    # --- the end --------------------------------------------------------------------------

    def stop_supervisors(self) -> None:
        """SIGTERM each live supervisor (the drain ladder) and record its exit code."""
        live = [s for s in self.supervisors if s.proc.poll() is None]
        self._check_alive()
        for sup in live:
            sup.terminate()
        for sup in live:
            code = sup.wait(DRAIN_S + 10)
            self.obs.expected_exits[sup.pid] = code
            if code is None:
                self.obs.notes.append(f"supervisor {sup.pid} ignored SIGTERM for "
                                      f"{DRAIN_S + 10}s; killed")
                sup.kill_tree()

    def collect(self) -> Observation:
        """Gather the observation: admits, ledger rows, crashes and final counts."""
        assert self.ledger is not None
        obs = self.obs
        if self.producer is not None:
            obs.admitted_at = {**self.producer.admitted(), **self.extra_admitted}
            obs.sent_at = {**self.producer.sent(), **self.extra_admitted}
            obs.producer_errors = self.producer.errors
        obs.ledger = self.ledger.rows()
        obs.crashes = sum(s.crashes for s in self.supervisors)
        obs.backoffs = sum(s.events["backoff"] for s in self.supervisors)
        obs.events = dict(sum((s.events for s in self.supervisors), Counter()))
        obs.late_beats = [span for s in self.supervisors for span in s.late_beats]
        try:
            if self._probe is None:
                self._probe = Queue(self.queue, redis_url=self.redis.url)
            obs.dead_ids = {j.id for j in self._probe.dead(limit=len(self.plan) + 1)}
        except (EchoMQError, OSError) as exc:
            obs.notes.append(f"could not read dead jobs: {exc}")
        obs.floor_open = self.floor_open()
        return obs


def _tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""
