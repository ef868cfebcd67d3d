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

``ECHOMQ_FAULT_SECONDS`` sets how long faults are injected (default 35: the whole
run stays near 60-90 s in CI; 600 for the ten-minute run). ``ECHOMQ_FAULT_SEED``
replays a run: the seed picks the jobs and the driver's faults and their timing.
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
from echomq.queue import Queue

from .proxy import Command, Cut, Link, Proxy, script

FAULT_S = float(os.environ.get("ECHOMQ_FAULT_SECONDS", "35"))
SEED = int(os.environ.get("ECHOMQ_FAULT_SEED") or random.randrange(1 << 30))
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
}
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
    # (job id, attempt) runs a consumer held when its connection was cut / it was SIGKILLed
    in_flight_cut: set[tuple[str, int]] = field(default_factory=set)
    in_flight_kill: set[tuple[str, int]] = field(default_factory=set)
    cuts: Counter[str] = field(default_factory=Counter)  # fired, by "before"/"after"
    # the standalone consumer's ends: cause (a signal's name, or "itself"), code, pid
    consumer_exits: list[tuple[str, int | None, int]] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)  # /livez seconds (inf: no answer)
    probe_errors: list[str] = field(default_factory=list)
    slow_held: list[int] = field(default_factory=list)  # slow connections open at each probe

    def where(self) -> str:
        return f"(replay: ECHOMQ_FAULT_SEED={self.seed}; logs and ledger in {self.workdir})"


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


def _args(cmd: Command, keys: int) -> list[bytes]:
    """ARGV of a script call (EVALSHA/EVAL sha-or-source numkeys keys... args...)."""
    return cmd[3 + keys:]


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
            elif self.h.claim(cmd) and len(cmd) > 19 and cmd[19]:
                link.tag = cmd[19].decode()
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
            argv = _args(cmd, 14)
            n = int(argv[3])
            self.h.ended([(argv[4 + 5 * k], argv[5 + 5 * k]) for k in range(n)])
        elif self.h.release(cmd):
            pairs = _args(cmd, 12)[3:]
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
                 consumer: ConsumerProc, health_port: int, slow: SlowClients) -> None:
        self.rng, self.server, self.run = rng, server, run
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
               "--health-port", str(health_port), "--health-host", "127.0.0.1"]
        sup = SupervisorProc(n, cmd, env, workdir / f"supervisor-{n}.log")
        started.append(sup)
        if not sup.wait_started():
            result.unasked.append(f"supervisor {n} did not start; log {sup.log_path}")
        return sup

    producer = Producer(server.url, queue, plan, FAULT_S * PRODUCE_SHARE)
    probe = Queue(queue, redis_url=server.url)
    slow = SlowClients(health_port, SLOW_CLIENTS)
    consumer = ConsumerProc(queue, consumer_proxy.url, env, workdir, holdings)
    try:
        slow.start()
        driver = Driver(rng, server, result, start_supervisor, proxy, holdings, consumer,
                        health_port, slow)
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
            consumer.ensure(result)
            doorbell.wait(CHECK_S)  # woken by a success; the re-check covers the rest
        driver.stop()
        result.ledger = ledger.rows()
        result.dead = {j.id: j.error or "" for j in probe.dead(limit=len(plan) + 1)}
        result.counts = probe.counts()
        result.producer_retries = producer.retries
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


def _unexplained_duplicates(run: Run) -> dict[str, list[tuple[int, int]]]:
    """Jobs completed more than once where an earlier completion's run was neither by a
    consumer that died mid-job nor held by a consumer at a cut of its connection."""
    died = _died_mid_job(run)
    return {j: runs for j, runs in _ok_runs(run).items()
            if len(runs) > 1 and any(pid not in died and (j, attempt) not in run.in_flight_cut
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
    lost = len(run.admitted - set(ok) - set(run.dead))
    exits = Counter(f"{cause}:{code}" for cause, code, _ in run.consumer_exits)
    unexplained = len(_unexplained_duplicates(run))
    return (f"fault run seed={run.seed}: {dict(run.actions)}, consumers killed "
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
    assert all(run.actions[action] for action in ACTIONS), figures(run)
    assert run.cuts["before"] + run.cuts["after"], figures(run)
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


def test_counts_agree_with_the_ledger(run: Run) -> None:
    completed = set(_ok_runs(run)) - set(run.dead)
    expected = {"waiting": 0, "scheduled": 0, "active": 0, "completed": len(completed),
                "dead": len(run.dead), "cancelled": 0}
    assert run.counts == expected, f"{run.counts} != {expected}; {figures(run)} {run.where()}"

