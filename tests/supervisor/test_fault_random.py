"""The randomized fault test: the delivery promise under a storm of faults, judged from a ledger.

One run (shared by the tests below, each asserting one part of the promise): an
AOF-backed server (``appendfsync always``), a supervisor with 4 consumer processes
and a standalone :class:`echomq.Consumer` process beside it on the same queue, a few
thousand jobs over many lanes (fast, slow, failing, flaky, and handlers that
``os._exit`` mid-job, with the boot-failure code 3 among their codes), while a
driver SIGKILLs consumers, SIGTERMs the supervisor and starts a new one, SIGKILLs the
server and starts it again on its append-only file, cuts the connection of a single
consumer process at a random command (before it reaches the server, or after it ran
with its reply lost), and SIGKILLs or SIGINTs the standalone consumer (starting it
again after each). Every connection goes through a proxy (:mod:`proxy`) that cuts
and watches: it follows which jobs each consumer holds (leased by a claim's reply,
until a settle or release of that lease ran), so a cut or a kill names the jobs in
flight. A hundred slow clients hold half-open connections to the health port all
along, while ``/livez`` is probed at random moments. The handler records every run's
start and end in a SQLite ledger outside the server.

``ECHOMQ_FAULT_DIAL`` sets the queue's durability dial (``volatile``: no floor;
``folded`` or ``durable``: a SQLite floor, and the driver also restarts the server
without persistence, its data lost, so the floor's rehydration is judged too: under
``folded`` a job with no floor row at the loss may be lost, under ``durable`` none);
unset, the seed picks it. ``ECHOMQ_FAULT_SECONDS`` sets how long faults are injected
(default 35: the whole run stays near 60-90 s in CI; 600 for the ten-minute run).
``ECHOMQ_FAULT_SEED`` replays a run: the seed picks the jobs, the dial (unless given)
and the driver's faults and their timing.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
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

from echomq import scripts
from echomq.errors import EchoMQError
from echomq.floor import Floor
from echomq.queue import Queue

from .proxy import Command, Cut, Link, Proxy, script

FAULT_S = float(os.environ.get("ECHOMQ_FAULT_SECONDS", "35"))
SEED = int(os.environ.get("ECHOMQ_FAULT_SEED") or random.randrange(1 << 30))
DIALS = ("volatile", "folded", "durable")
# drawn from a generator of its own: the seed's plan and faults stay what they were
DIAL = os.environ.get("ECHOMQ_FAULT_DIAL") or random.Random(SEED ^ 0x5EED).choice(DIALS)
PROCESSES = 4
LANES = 64
# 60 jobs a second of faults for the first 35 s, 25 past them: every consumer's traffic
# goes through the test's proxy, so a long run on a shared machine keeps a backlog it can
# still work off within the settle window
JOBS = max(200, int(min(FAULT_S, 35) * 60 + max(0.0, FAULT_S - 35) * 25))
PRODUCE_SHARE = 0.6  # admits are spread over this share of the fault window
BEAT_MS = 200
LEASE_MS = 2000
DRAIN_S = 10.0
MAX_ATTEMPTS = 3  # the defaults: what users run
MAX_STALLS = 1
BACKOFF_S = 0.05
SETTLE_S = 60.0 + FAULT_S / 3
CHECK_S = 0.25  # "every job finished" is an absence: re-checked on this beat
HANDLER = "echomq.supervisor.drills.handler:handle"
MIX = (  # kind, share
    ("fast", 0.69), ("slow", 0.08), ("flaky", 0.10), ("failing", 0.04),
    ("exit_first", 0.075), ("exit_always", 0.015),
)
EXIT_CODES = (1, 3, 9)
SLOW_CLIENTS = 100  # half-open connections held on the health port
PROBE_TIMEOUT_S = 1.0  # /livez must answer within this, slow clients or not
CONSUMER_DRAIN_S = 10.0
START_S = 30.0  # a consumer's start, a server's restart included
ACTIONS = {  # the driver's faults and their weights
    "kill_child": 6, "cut_child": 6, "restart_supervisor": 1, "restart_server": 1,
    "kill_consumer": 2, "interrupt_consumer": 2,
    **({"wipe_server": 1} if DIAL != "volatile" else {}),  # a floor brings the jobs back
}
REHYDRATE_S = 30.0  # bounds the wait for the scheduler's rehydration after a wipe
# "completed less than a beat before the loss" (docs/durability.md): the beat plus the
# floor's write on a loaded machine
CLOSE_WINDOW_S = BEAT_MS / 1000 + 0.3
# the whole run happens in the first test's setup: its bound grows with the fault window
pytestmark = pytest.mark.timeout(int(120 + 1.5 * FAULT_S + 2 * SETTLE_S))


@dataclass(frozen=True)
class Planned:
    id: str
    kind: str
    lane: str
    payload: dict[str, Any]
    after: tuple[str, ...] = ()  # a chord's callback: the jobs it waits for


CHORD_EVERY = 20  # every 20th job is a chord's callback waiting for the jobs before it
MUST_END = ("failing", "exit_always")  # members a callback does not wait for: they die


def make_plan(rng: random.Random, queue: str) -> list[Planned]:
    kinds, weights = zip(*MIX, strict=True)
    plan: list[Planned] = []
    for i in range(JOBS):
        if i % CHORD_EVERY == CHORD_EVERY - 1:
            members = tuple(p.id for p in plan[-(CHORD_EVERY - 1):] if p.kind not in MUST_END
                            and not p.after)
            plan.append(Planned(f"{queue}-{i:06d}", "callback", f"lane-{rng.randrange(LANES)}",
                                {"trace": True, "work_ms": 1.0}, members))
            continue
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
    """Admits the plan in paced batches, a chord whole in one call; a batch that meets a
    restarting server is retried (admit is idempotent per job id)."""

    def __init__(self, url: str, queue: str, plan: list[Planned], over_s: float,
                 floor: Floor | None = None) -> None:
        super().__init__(name="fault-producer", daemon=True)
        self.queue = Queue(queue, redis_url=url, max_attempts=MAX_ATTEMPTS,
                           max_stalls=MAX_STALLS, floor=floor,
                           durability="durable" if DIAL == "durable" else None)
        self.plan, self.over_s = plan, over_s
        self.halt = threading.Event()
        self.admitted: set[str] = set()
        self.admitted_at: dict[str, float] = {}  # when each job's admit returned
        self.retries = 0

    def run(self) -> None:
        batches = 50
        size = max(1, -(-len(self.plan) // batches))
        # a callback names the jobs before it: a chord in two calls would let a loss
        # between them take the members and refuse the callback (UnknownDependency)
        size = -(-size // CHORD_EVERY) * CHORD_EVERY
        start = time.monotonic()
        for n, i in enumerate(range(0, len(self.plan), size)):
            # pacing, not polling: the wait ends at this batch's slot or on halt
            if self.halt.wait(max(0.0, start + n * self.over_s / batches - time.monotonic())):
                return
            batch = self.plan[i:i + size]
            jobs = [("fault", p.payload, {"job_id": p.id, "lane": p.lane, "backoff": BACKOFF_S,
                                          **({"after": list(p.after)} if p.after else {})})
                    for p in batch]
            while not self.halt.is_set():
                try:
                    self.queue.add_many(jobs)
                except (EchoMQError, OSError):
                    self.retries += 1
                    self.halt.wait(CHECK_S)  # no event says the server is back: try again
                    continue
                now = time.time()
                self.admitted.update(p.id for p in batch)
                self.admitted_at.update((p.id, now) for p in batch)
                break
        self.queue.close()


@dataclass
class Wipe:
    """One restart of the server without persistence."""

    kill_at: float
    open_rows: set[str]  # jobs whose floor row was open just before the kill
    restarted_at: float = 0.0  # the empty server accepts connections
    rehydrated_at: float = float("inf")  # the scheduler logged its rehydration


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
    # (job id, attempt) runs a consumer held when its connection was cut / it was SIGKILLed
    in_flight_cut: set[tuple[str, int]] = field(default_factory=set)
    in_flight_kill: set[tuple[str, int]] = field(default_factory=set)
    cuts: Counter[str] = field(default_factory=Counter)  # fired, by "before"/"after"
    # the standalone consumer's ends: cause (a signal's name, or "itself"), code, pid
    consumer_exits: list[tuple[str, int | None, int]] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)  # /livez seconds (inf: no answer)
    probe_errors: list[str] = field(default_factory=list)
    slow_held: list[int] = field(default_factory=list)  # slow connections open at each probe
    observer_errors: list[str] = field(default_factory=list)  # what the proxies' observers raised
    dial: str = DIAL
    wipes: list[Wipe] = field(default_factory=list)
    admitted_at: dict[str, float] = field(default_factory=dict)
    # when a settle that scheduled each job's retry ran (its reply, relayed or lost, as the
    # proxies saw it): the job entered the schedule set then, the fold's beat starts there
    retried_at: dict[str, list[float]] = field(default_factory=dict)

    def where(self) -> str:
        return (f"(replay: ECHOMQ_FAULT_SEED={self.seed} ECHOMQ_FAULT_DIAL={self.dial}; logs "
                f"and ledger in {self.workdir})")

    def excused(self, strict: bool = True) -> set[str]:
        """Jobs a wipe may take as the dial allows: under ``folded``, those admitted before
        a wipe whose floor row was not open just before it, and (``strict``, judged from
        the ledger) that were immediate and never failed before it, or became blocked (a
        callback's admit) or retried (a failure) less than a beat before it; under
        ``durable``, none. A retry entered the schedule set when the settle that
        scheduled it ran (as the proxies saw it), not when its handler failed: a batch's
        outcomes may reach the server later than that. One that entered while the fold
        lease was gone with Valkey's data (after a wipe, until the scheduler's return) is
        folded as the scheduler's sweep reaches it, not within a beat: the lapse window of
        docs/durability.md."""
        if self.dial != "folded":
            return set()
        out = set()
        for j, at in self.admitted_at.items():
            for w in self.wipes:
                if at >= w.restarted_at or j in w.open_rows:
                    continue
                entered = [at] if self.plan[j].after else self.retried_at.get(j, [])
                if strict and any(t < w.kill_at - CLOSE_WINDOW_S and not self.lapsed(t)
                                  for t in entered):
                    continue  # on the floor by then: the dial covers it
                out.add(j)
                break
        return out

    def lapsed(self, at: float) -> bool:
        """True when ``at`` fell between a wipe and the scheduler's rehydration after it."""
        return any(w.kill_at <= at < w.rehydrated_at for w in self.wipes)


def _resp(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """A RESP2/RESP3 reply parsed: bytes, int, None, an exception or a list; and past it."""
    end = buf.index(b"\r\n", pos)
    kind, head, pos = buf[pos:pos + 1], buf[pos + 1:end], end + 2
    if kind in (b"$", b"=", b"!"):
        size = int(head)
        if size < 0:
            return None, pos
        return buf[pos:pos + size], pos + size + 2
    if kind in (b"*", b"~", b">", b"%"):
        count = int(head) * (2 if kind == b"%" else 1)
        items = []
        for _ in range(max(count, 0)):
            item, pos = _resp(buf, pos)
            items.append(item)
        return (None if int(head) < 0 else items), pos
    if kind == b"-":
        return RuntimeError(head.decode(errors="replace")), pos
    if kind == b":":
        return int(head), pos
    return head, pos


def _args(cmd: Command) -> list[bytes]:
    """ARGV of a script call (EVALSHA/EVAL sha-or-source numkeys keys... args...), past
    the number of keys the call itself gives (a script that gains a key moves its ARGV)."""
    return cmd[3 + int(cmd[2]):]


class Holdings:
    """Which jobs each consumer holds, as the proxy sees it: a claim's reply (relayed or
    lost) leases jobs to the claimer (a supervisor child by its claims-record name, the
    standalone consumer by its proxy); the lease ends when a settle or release of that
    (id, token) pair ran, or the job is leased again (reaped and claimed)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.lock = threading.Lock()
        self.owner: dict[str, tuple[str, bytes, int]] = {}  # job -> holder, token, attempt
        self.claim, self.settle = script(scripts.CLAIM), script(scripts.SETTLE)
        self.release = script(scripts.REAP)
        self.claims: Counter[str] = Counter()  # claims sent, by holder
        self.claimed_cond = threading.Condition(self.lock)

    def claims_sent(self, holder: str) -> int:
        with self.lock:
            return self.claims[holder]

    def wait_claim(self, holder: str, after: int, timeout: float) -> bool:
        """True once ``holder`` sent more than ``after`` claims; False at the timeout."""
        with self.claimed_cond:
            return self.claimed_cond.wait_for(lambda: self.claims[holder] > after, timeout)

    def observer(self, tag: str | None) -> Observed:
        return Observed(self, tag)

    def held_by(self, holder: str) -> set[tuple[str, int]]:
        with self.lock:
            return {(job, attempt) for job, (who, _, attempt) in self.owner.items()
                    if who == holder}

    def claimed(self, holder: str, reply: Any) -> None:
        if not isinstance(reply, list):
            return
        with self.lock:
            for i in range(0, len(reply) - 11, 12):
                job, token, attempts = reply[i], reply[i + 1], reply[i + 5]
                self.owner[job.decode()] = (holder, token, int(attempts))

    def retried(self, jobs: list[bytes], reply: bytes) -> None:
        """Note when a settle's reply said it scheduled a job's retry (code 2)."""
        try:
            codes, _ = _resp(reply)
        except ValueError:
            return
        if not isinstance(codes, list):
            return
        now = time.time()
        with self.lock:
            for job, code in zip(jobs, codes, strict=False):
                if code == 2:
                    self.run.retried_at.setdefault(job.decode(), []).append(now)

    def ended(self, pairs: list[tuple[bytes, bytes]]) -> None:
        with self.lock:
            for job, token in pairs:
                held = self.owner.get(job.decode())
                if held is not None and held[1] == token:
                    del self.owner[job.decode()]


class Observed:
    """The proxy's observer for one kind of client: ``tag`` names every connection's
    holder (the standalone consumer's proxy), or None (a child names itself in its claims:
    the supervisor's own connections never claim)."""

    def __init__(self, holdings: Holdings, tag: str | None) -> None:
        self.h, self.tag = holdings, tag

    def command(self, link: Link, cmd: Command) -> None:
        if link.tag is None:
            if self.tag is not None:
                link.tag = self.tag
            elif self.h.claim(cmd) and len(argv := _args(cmd)) > 4 and argv[4]:
                link.tag = argv[4].decode()  # ARGV[5]: the claimer
        if link.tag is not None and self.h.claim(cmd):
            with self.h.claimed_cond:
                self.h.claims[link.tag] += 1
                self.h.claimed_cond.notify_all()

    def reply(self, link: Link, cmd: Command, reply: bytes, dropped: bool) -> None:
        if not cmd or reply[:1] == b"-":
            return
        if self.h.claim(cmd):
            try:
                parsed, _ = _resp(reply)
            except ValueError:
                return
            holder = link.tag or f"link-{id(link)}"
            self.h.claimed(holder, parsed)
            if dropped and isinstance(parsed, list):  # leased by a claim the cut made unseen
                with self.h.lock:
                    self.h.run.in_flight_cut.update(
                        (parsed[i].decode(), int(parsed[i + 5]))
                        for i in range(0, len(parsed) - 11, 12))
        elif self.h.settle(cmd):
            argv = _args(cmd)
            n = int(argv[3])
            self.h.ended([(argv[4 + 5 * k], argv[5 + 5 * k]) for k in range(n)])
            self.h.retried([argv[4 + 5 * k] for k in range(n)], reply)
        elif self.h.release(cmd):
            pairs = _args(cmd)[3:]
            self.h.ended(list(zip(pairs[0::2], pairs[1::2], strict=False)))

    def cut(self, link: Link, armed: Cut) -> None:
        if link.tag is not None:
            held = self.h.held_by(link.tag)
            with self.h.lock:
                self.h.run.in_flight_cut.update(held)
                self.h.run.cuts[armed.when] += 1


class SlowClients(threading.Thread):
    """Holds ``count`` connections to the health port, each with a request line and no
    end of headers (opened again when the server drops one, or after a restart)."""

    def __init__(self, port: int, count: int) -> None:
        super().__init__(name="fault-slow-clients", daemon=True)
        self.port, self.count = port, count
        self.halt = threading.Event()
        self.opened = 0
        self.held = 0
        self.full = threading.Event()  # set while all of them are held

    def wait_held(self, timeout: float) -> bool:
        """True once every slow connection is open (they reopen after a restart)."""
        return self.full.wait(timeout)

    def _count(self, sel: selectors.BaseSelector) -> None:
        self.held = len(sel.get_map())
        if self.held >= self.count:
            self.full.set()
        else:
            self.full.clear()

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self.halt.is_set():
                while len(sel.get_map()) < self.count:
                    try:
                        s = socket.create_connection(("127.0.0.1", self.port), timeout=1)
                        s.sendall(b"GET /livez HTTP/1.1\r\nHost: slow\r\n")
                    except OSError:
                        break  # no server now (a restart): try again on the next turn
                    s.setblocking(False)
                    sel.register(s, selectors.EVENT_READ)
                    self.opened += 1
                self._count(sel)
                for key, _ in sel.select(timeout=0.2 if len(sel.get_map()) else None) \
                        if sel.get_map() else []:
                    sock = key.fileobj
                    try:
                        data = sock.recv(4096)  # type: ignore[union-attr]
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(sock)
                        sock.close()  # type: ignore[union-attr]
                        self._count(sel)
                if len(sel.get_map()) < self.count:
                    self.halt.wait(0.1)  # refused: the supervisor is restarting
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()


def probe_livez(port: int) -> tuple[float, str]:
    """Seconds until /livez answered 200 (inf when it did not within the timeout)."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", "/livez")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            return float("inf"), f"/livez answered {resp.status}"
        return time.monotonic() - start, ""
    except OSError as exc:
        return float("inf"), f"/livez: {exc!r}"
    finally:
        conn.close()


CONSUMER = """
import echomq
from echomq.supervisor.drills.handler import handle
echomq.Consumer({queue!r}, handle, redis_url={url!r}, beat_ms={beat}, lease_ms={lease},
               drain_timeout={drain}).run()
"""


class ConsumerProc:
    """The standalone consumer beside the supervisor, started again whenever it ended."""

    def __init__(self, queue: str, url: str, env: dict[str, str], workdir: Path,
                 holdings: Holdings) -> None:
        self.code = CONSUMER.format(queue=queue, url=url, beat=BEAT_MS, lease=LEASE_MS,
                                    drain=CONSUMER_DRAIN_S)
        self.env, self.workdir, self.holdings = env, workdir, holdings
        self.n = 0
        self.claims_before = 0
        self.proc = self._start()

    def running(self, timeout: float) -> bool:
        """Wait until this process claimed once (its loop runs: a SIGINT stops it, no longer
        an interpreter still starting up)."""
        return self.holdings.wait_claim("consumer", self.claims_before, timeout)

    def _start(self) -> subprocess.Popen[bytes]:
        self.n += 1
        self.claims_before = self.holdings.claims_sent("consumer")
        with open(self.workdir / f"consumer-{self.n}.log", "wb") as log:
            return subprocess.Popen([sys.executable, "-c", self.code], env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT)

    def ensure(self, run: Run) -> None:
        """Start it again if it ended by itself (a handler's ``os._exit``)."""
        code = self.proc.poll()
        if code is not None:
            run.consumer_exits.append(("itself", code, self.proc.pid))
            self.proc = self._start()

    def signal(self, signum: int, run: Run) -> None:
        self.ensure(run)
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass
        try:
            code: int | None = self.proc.wait(CONSUMER_DRAIN_S + 20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
            self.proc.wait()
        run.consumer_exits.append((signal.Signals(signum).name, code, self.proc.pid))
        self.proc = self._start()

    def stop(self, run: Run) -> None:
        if self.proc.poll() is None and self.running(START_S):
            self.proc.send_signal(signal.SIGINT)
            try:
                code: int | None = self.proc.wait(CONSUMER_DRAIN_S + 20)
            except subprocess.TimeoutExpired:
                code = None
            run.consumer_exits.append(("SIGINT", code, self.proc.pid))
        self.finish()

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Driver:
    """The faults, in an order and at times drawn from the seed."""

    def __init__(self, rng: random.Random, server: LocalRedis, run: Run,
                 start_supervisor: Any, proxy: Proxy, holdings: Holdings,
                 consumer: ConsumerProc, health_port: int, slow: SlowClients,
                 queue: str = "", floor: Floor | None = None) -> None:
        self.rng, self.server, self.run = rng, server, run
        self.queue, self.floor = queue, floor
        self.start_supervisor = start_supervisor
        self.proxy, self.holdings, self.consumer = proxy, holdings, consumer
        self.health_port, self.slow = health_port, slow
        self.armed: Cut | None = None
        self.current: SupervisorProc = start_supervisor()

    def drive(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        first = list(ACTIONS)
        self.rng.shuffle(first)  # each kind at least once, early
        while time.monotonic() < end:
            action = first.pop() if first else self.rng.choices(
                list(ACTIONS), list(ACTIONS.values()))[0]
            getattr(self, action)()
            self.run.actions[action] += 1
            self.wait_exit_that_should_not_come(self.rng.uniform(0.2, 1.5))
        self.disarm()

    def wait_exit_that_should_not_come(self, seconds: float) -> None:
        """Let the system run: a wait on the supervisor's exit, which must not come; a
        probe of /livez at a random moment within it."""
        at = self.rng.uniform(0, seconds)
        code = self.current.wait(at)
        if code is None:
            self.slow.wait_held(5.0)  # after a restart they reconnect first
            self.run.slow_held.append(self.slow.held)
            took, error = probe_livez(self.health_port)
            self.run.probes.append(took)
            if error:
                self.run.probe_errors.append(error)
            code = self.current.wait(seconds - at)
        self.consumer.ensure(self.run)
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

    def wipe_server(self) -> None:
        """Restart the server without persistence (its data lost), after noting which jobs
        the floor holds; return once the scheduler rehydrated the queue from it."""
        assert self.floor is not None
        open_rows = {r.job_id for r in self.floor.rows(self.queue, self.run.plan)}
        wipe = Wipe(kill_at=time.time(), open_rows=open_rows)
        self.run.wipes.append(wipe)
        before = self.current.events["rehydrate"]
        self.server.kill()
        threading.Event().wait(self.rng.uniform(0.2, 2.5))  # the outage's length
        self.server.restart_empty()
        wipe.restarted_at = time.time()
        if self.current.wait_event("rehydrate", before, REHYDRATE_S):
            wipe.rehydrated_at = time.time()
        else:
            self.run.unasked.append(f"no rehydration within {REHYDRATE_S}s of a wipe; log "
                                    f"{self.current.log_path}")

    def cut_child(self) -> None:
        """Arm a cut of one consumer process's connection at its nth command from now
        (any command of a connection that has claimed for a supervisor's child), before
        the command reaches the server or after it ran; one armed at a time."""
        if self.armed is not None and not self.armed.fired.is_set():
            return  # not reached yet (a quiet queue): that one still stands
        self.armed = self.proxy.cut(lambda cmd: True, nth=self.rng.randint(1, 40),
                                    when=self.rng.choice(("before", "after")),
                                    on=lambda link: link.tag is not None)

    def disarm(self) -> None:
        with self.proxy.lock:
            self.proxy.cuts.clear()

    def kill_consumer(self) -> None:
        self.consumer.ensure(self.run)
        self.run.killed.add(self.consumer.proc.pid)
        # what it holds now is in flight; jobs it claims before the signal lands are too:
        # the pair is read again once it is dead (the proxy saw every claim it made)
        before = self.holdings.held_by("consumer")
        self.consumer.signal(signal.SIGKILL, self.run)
        self.run.in_flight_kill.update(before | self.holdings.held_by("consumer"))

    def interrupt_consumer(self) -> None:
        self.consumer.ensure(self.run)
        if not self.consumer.running(START_S):
            self.run.unasked.append(f"standalone consumer {self.consumer.n} never claimed")
        self.consumer.signal(signal.SIGINT, self.run)

    def stop(self) -> None:
        self.current.terminate()
        self.run.exits.append(self.current.wait(DRAIN_S + 20))
        self.consumer.stop(self.run)


def _finished(run: Run, ledger: Ledger, q: Queue, admitted_at: dict[str, float]) -> bool:
    done = ledger.done_ids()
    dead = {j.id for j in q.dead(limit=len(run.plan) + 1)}
    run.admitted_at = admitted_at
    ended = done | dead | run.excused(strict=False)
    if not run.admitted <= ended:
        if not run.wipes:
            return False
        run.ledger = ledger.rows()  # dead records a wipe took: judged from the ledger
        if not run.admitted <= ended | _dead_with_a_wipe(run):
            return False
    c = q.counts()
    return c["waiting"] == c["scheduled"] == c["active"] == c["blocked"] == 0


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    if server_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("the fault test needs a redis-server/valkey-server binary")
        pytest.skip("the fault test needs a redis-server/valkey-server binary")
    rng = random.Random(SEED)
    print(f"\nrandomized fault test: ECHOMQ_FAULT_SEED={SEED} ECHOMQ_FAULT_SECONDS={FAULT_S} "
          f"ECHOMQ_FAULT_DIAL={DIAL}", file=sys.stderr)
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
    floor_args: list[str] = []
    floor: Floor | None = None
    if DIAL != "volatile":
        floor_url = f"sqlite:///{workdir / 'floor.db'}"
        subprocess.run([*CLI, "migrate", "--floor-url", floor_url], env=env, check=True,
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        floor_args = ["--floor-url", floor_url, "--durability", DIAL]
        floor = Floor.from_url(floor_url)
    started: list[SupervisorProc] = []
    holdings = Holdings(result)
    # the supervisor and its children reach the server through one proxy (cuts fire only
    # on the connections of children), the standalone consumer through another
    proxy = Proxy(server.port, observer=holdings.observer(None))
    consumer_proxy = Proxy(server.port, observer=holdings.observer("consumer"))
    with socket.create_server(("127.0.0.1", 0)) as free:
        health_port = free.getsockname()[1]

    def start_supervisor() -> SupervisorProc:
        n = len(started)
        cmd = [*CLI, "start", "--redis-url", proxy.url, "--queue", queue, "--handler", HANDLER,
               "--processes", str(PROCESSES), "--beat-ms", str(BEAT_MS), "--lease-ms",
               str(LEASE_MS), "--drain-timeout", str(DRAIN_S), "--log-json",
               "--health-port", str(health_port), "--health-host", "127.0.0.1", *floor_args]
        sup = SupervisorProc(n, cmd, env, workdir / f"supervisor-{n}.log")
        started.append(sup)
        if not sup.wait_started():
            result.unasked.append(f"supervisor {n} did not start; log {sup.log_path}")
        return sup

    producer = Producer(server.url, queue, plan, FAULT_S * PRODUCE_SHARE,
                        floor if DIAL == "durable" else None)
    probe = Queue(queue, redis_url=server.url)
    slow = SlowClients(health_port, SLOW_CLIENTS)
    consumer = ConsumerProc(queue, consumer_proxy.url, env, workdir, holdings)
    try:
        slow.start()
        driver = Driver(rng, server, result, start_supervisor, proxy, holdings, consumer,
                        health_port, slow, queue, floor)
        producer.start()
        driver.drive(FAULT_S)
        producer.join(timeout=SETTLE_S)
        result.admitted = set(producer.admitted)
        result.admitted_at = dict(producer.admitted_at)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            try:
                if _finished(result, ledger, probe, dict(producer.admitted_at)):
                    result.settled = True
                    break
            except (EchoMQError, OSError):
                pass
            consumer.ensure(result)
            doorbell.wait(CHECK_S)  # woken by a success; the re-check covers the rest
        driver.stop()
        result.ledger = ledger.rows()
        result.dead = {j.id: j.error or "" for j in probe.dead(limit=len(plan) + 1)}
        result.counts = probe.counts()
        result.producer_retries = producer.retries
        result.observer_errors = proxy.errors + consumer_proxy.errors
        yield result
    finally:
        producer.halt.set()
        slow.halt.set()
        producer.join(timeout=15)
        slow.join(timeout=15)
        consumer.finish()
        for sup in started:
            sup.finish()
        probe.close()
        doorbell.close()
        ledger.close()
        proxy.close()
        consumer_proxy.close()
        server.stop()
        if floor is not None:
            floor.dispose()
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


def _ok_runs(run: Run) -> dict[str, list[tuple[int, int]]]:
    """job -> (attempt, pid) of each run that did the job's work, in ledger order."""
    ok: dict[str, list[tuple[int, int]]] = {}
    for job_id, attempt, pid, kind, _ in run.ledger:
        if kind == "ok":
            ok.setdefault(job_id, []).append((attempt, pid))
    return ok


def _in_a_wipe_window(run: Run) -> set[tuple[str, int, int]]:
    """(job, attempt, pid) of successful runs a wipe may repeat: begun before the
    rehydration ended and done less than a beat before the loss or after it (their floor
    rows were still open; docs/durability.md, "the close window")."""
    began: dict[tuple[str, int, int], float] = {}
    out = set()
    for job_id, attempt, pid, kind, at in run.ledger:
        if kind == "start":
            began.setdefault((job_id, attempt, pid), at)
        elif kind == "ok":
            start = began.get((job_id, attempt, pid), at)
            if any(start < w.rehydrated_at and at > w.kill_at - CLOSE_WINDOW_S
                   for w in run.wipes):
                out.add((job_id, attempt, pid))
    return out


def _unexplained_duplicates(run: Run) -> dict[str, list[tuple[int, int]]]:
    """Jobs completed more than once where an earlier completion's run was neither by a
    consumer that died mid-job, nor held by a consumer at a cut of its connection, nor in
    a wipe's window."""
    died = _died_mid_job(run)
    wiped = _in_a_wipe_window(run)
    return {j: runs for j, runs in _ok_runs(run).items()
            if len(runs) > 1 and any(pid not in died and (j, attempt) not in run.in_flight_cut
                                     and (j, attempt, pid) not in wiped
                                     for attempt, pid in runs[:-1])}


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def figures(run: Run) -> str:
    ok = _ok_runs(run)
    dups = [j for j, runs in ok.items() if len(runs) > 1]
    died = _died_mid_job(run)
    cut = sum(1 for j in dups if any((j, a) in run.in_flight_cut for a, _ in ok[j][:-1]))
    cut_alone = sum(1 for j in dups if any((j, a) in run.in_flight_cut and pid not in died
                                           for a, pid in ok[j][:-1]))
    excused = run.excused()
    lost = len(run.admitted - set(ok) - set(run.dead) - excused - _dead_with_a_wipe(run))
    taken = len(run.admitted - set(ok) - set(run.dead)) - lost
    wiped = sum(1 for j in dups if any((j, a, p) in _in_a_wipe_window(run) for a, p in ok[j][:-1]))
    exits = Counter(f"{cause}:{code}" for cause, code, _ in run.consumer_exits)
    unexplained = len(_unexplained_duplicates(run))
    return (f"fault run seed={run.seed} dial={run.dial}: {dict(run.actions)}, wipes "
            f"{len(run.wipes)} (taken by them as the dial allows {taken}, duplicates in "
            f"their window {wiped}), consumers killed "
            f"{len(run.killed)}, cuts fired {dict(run.cuts)} (jobs in flight at a cut "
            f"{len(run.in_flight_cut)}), standalone consumer exits {dict(exits)}, jobs "
            f"{len(run.plan)} admitted {len(run.admitted)}, completed {len(set(ok))}, dead "
            f"{len(run.dead)}, lost {lost}, duplicates {len(dups)} (in flight at a cut "
            f"{cut}, of them by a consumer that did not die {cut_alone}), unexplained "
            f"duplicates {unexplained}, wrongly dead {len(_wrongly_dead(run))}, producer "
            f"retries {run.producer_retries}, /livez probes {len(run.probes)} (slow clients "
            f"held: fewest {min(run.slow_held, default=0)}) p99 "
            f"{_p99(run.probes) * 1000:.1f} ms max {max(run.probes, default=0) * 1000:.1f} ms, "
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
    # the standalone consumer's: the runs it held when SIGKILLed that wrote no row
    attempts = {(job_id, attempt) for job_id, attempt, _, kind, _ in run.ledger
                if kind == "start"}
    unseen.update(job_id for job_id, attempt in run.in_flight_kill
                  if (job_id, attempt) not in attempts)
    return unseen


def _story(run: Run, job_id: str) -> str:
    """One job's history against the wipes, for a failure's message."""
    rows = [(kind, round(at, 3)) for j, _, _, kind, at in run.ledger if j == job_id]
    wipes = [(round(w.kill_at, 3), job_id in w.open_rows) for w in run.wipes]
    return (f"{job_id} {run.plan[job_id].kind}: admitted "
            f"{round(run.admitted_at.get(job_id, 0.0), 3)}, ledger {rows}, retries "
            f"scheduled {[round(t, 3) for t in run.retried_at.get(job_id, ())]}, wipes "
            f"(kill, row open) {wipes}")


def _dead_with_a_wipe(run: Run) -> set[str]:
    """Jobs that ran out of attempts or stalls (or a callback whose member did) while a wipe
    was still to come: their dead records may have gone with Valkey's data."""
    if not run.wipes:
        return set()
    last = max(w.kill_at for w in run.wipes)
    runs, unseen = _runs(run), _killed_before_the_ledger(run)
    ends: dict[str, float] = {}
    for job_id, _, _, _, at in run.ledger:
        ends[job_id] = max(ends.get(job_id, 0.0), at)
    out = set()
    for job_id in run.plan:
        mine = runs.get(job_id, {})
        unfinished = sum(1 for kinds in mine.values() if kinds == {"start"}) + unseen[job_id]
        fails = sum(1 for kinds in mine.values() if "fail" in kinds)
        attempts = len(mine) + unseen[job_id]  # a run a kill cut short counts as one
        if (fails and attempts >= MAX_ATTEMPTS or unfinished >= MAX_STALLS + 1) \
                and ends.get(job_id, 0.0) < last:
            out.add(job_id)
    return out | {p.id for p in run.plan.values() if set(p.after) & out}


def _wrongly_dead(run: Run) -> dict[str, str]:
    """Dead jobs whose handler neither failed out nor stalled enough to be buried."""
    runs = _runs(run)
    unseen = _killed_before_the_ledger(run)
    wrong = {}
    for job_id, error in run.dead.items():
        plan = run.plan[job_id]
        if plan.kind == "failing":
            continue  # it fails on every attempt: dead is its due
        if plan.after and any(error == f"dependency {m} dead" and m in run.dead
                              for m in plan.after):
            continue  # a callback whose member died: dead is its due
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
    assert all(run.actions[action] for action in ACTIONS), figures(run)
    assert run.cuts["before"] + run.cuts["after"], figures(run)
    assert len(run.admitted) == len(run.plan), figures(run) + run.where()
    assert not run.unasked, f"{run.unasked} {run.where()}"
    assert all(code == 0 for code in run.exits), f"SIGTERM exits {run.exits} {run.where()}"


def test_every_job_completed_or_dead(run: Run) -> None:
    ok = _ok_runs(run)
    lost = sorted(run.admitted - set(ok) - set(run.dead) - run.excused()
                  - _dead_with_a_wipe(run))
    assert not lost, (f"{len(lost)} job(s) neither completed nor dead, e.g. "
                      f"{[_story(run, j) for j in lost[:5]]}; {figures(run)} {run.where()}")
    assert run.settled, figures(run) + run.where()


def test_no_job_dead_whose_handler_did_not_fail_or_stall(run: Run) -> None:
    wrong = _wrongly_dead(run)
    assert not wrong, (f"{len(wrong)} job(s) dead without cause, e.g. "
                       f"{dict(list(wrong.items())[:4])}; {figures(run)} {run.where()}")


def test_the_standalone_consumer_stops_cleanly_on_sigint(run: Run) -> None:
    """A SIGINT lets the running job finish and exits 0 (unless a handler's planned
    ``os._exit`` came first)."""
    crashed = _died_mid_job(run) - run.killed
    codes = [(code, pid) for cause, code, pid in run.consumer_exits if cause == "SIGINT"]
    assert codes, figures(run)
    bad = [(code, pid) for code, pid in codes if code != 0 and pid not in crashed]
    assert not bad, f"SIGINT exits (code, pid) {bad}; {figures(run)} {run.where()}"


def test_livez_answers_within_a_second_beside_slow_clients(run: Run) -> None:
    assert run.probes, figures(run)
    assert not run.probe_errors, f"{run.probe_errors[:5]}; {figures(run)} {run.where()}"
    assert max(run.probes) < PROBE_TIMEOUT_S, figures(run)


def test_duplicates_only_for_jobs_in_flight_at_a_kill_or_a_cut(run: Run) -> None:
    unexplained = _unexplained_duplicates(run)
    assert not unexplained, (f"{len(unexplained)} job(s) completed more than once by "
                             f"consumers that did not die mid-job nor held them at a cut, "
                             f"e.g. "
                             f"{dict(list(unexplained.items())[:4])}; {figures(run)} "
                             f"{run.where()}")


def test_chord_callbacks_run_after_their_members_and_never_twice_unexplained(
        run: Run) -> None:
    """Every callback completed after each of its members first completed, or died with a
    member that died; it ran more than once only when a kill or a cut caught it."""
    first: dict[str, float] = {}  # job -> when its first successful run recorded its end
    for job_id, _attempt, _pid, kind, at in run.ledger:
        if kind == "ok":
            first[job_id] = min(first.get(job_id, at), at)
    callbacks = [p for p in run.plan.values() if p.after]
    assert callbacks, figures(run)
    taken = run.excused()  # lost with Valkey as the dial allows: counted completed
    early = [p.id for p in callbacks if p.id in first
             and any(m not in taken and (m not in first or first[m] > first[p.id])
                     for m in p.after)]
    unfinished = [_story(run, m) for p in callbacks if p.id in early[:5]
                  for m in p.after if m not in first]
    assert not early, (f"callbacks ran before their members: {early[:5]}, members "
                       f"{unfinished} {run.where()}")
    gone = taken | _dead_with_a_wipe(run)
    ended = [p.id for p in callbacks
             if p.id not in first and p.id not in run.dead and p.id not in gone]
    assert not ended, f"callbacks neither completed nor dead: {ended[:5]} {run.where()}"
    assert not set(_unexplained_duplicates(run)) & {p.id for p in callbacks}, run.where()


def test_the_proxies_read_every_command_and_reply(run: Run) -> None:
    """The holdings the other tests judge are complete: no call or reply was misread."""
    assert not run.observer_errors, f"{run.observer_errors[:5]} {run.where()}"


def test_counts_agree_with_the_ledger(run: Run) -> None:
    completed = set(_ok_runs(run)) - set(run.dead)
    expected = {"waiting": 0, "scheduled": 0, "active": 0, "completed": len(completed),
                "dead": len(run.dead), "cancelled": 0, "blocked": 0}
    if run.wipes:  # the records of jobs completed before a wipe went with the data
        assert run.counts["completed"] <= len(completed), figures(run) + run.where()
        expected["completed"] = run.counts["completed"]
    assert run.counts == expected, f"{run.counts} != {expected}; {figures(run)} {run.where()}"

