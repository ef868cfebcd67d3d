"""Each role's ACL rule, as docs/security.md writes it, tested as exactly that rule on a
real server: the role's workload passes under it with nothing refused (ACL LOG stays
empty), the commands the workload sends (MONITOR, scripts included) are exactly the
rule's, the example manifests carry the same rules, and a rule missing a command
fails with an error that names the command and the docs."""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
import yaml
from echomq.supervisor.drills.localredis import LocalRedis, free_port

import echomq
from echomq import scripts
from echomq.errors import PermissionDenied
from echomq.floor import Floor
from echomq.keys import Keys
from echomq.lanes import Lanes
from echomq.ops import cli as ops_cli
from echomq.ops.dashboard import Dashboard

from .conftest import Proc, wait_until

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "security.md"
EXAMPLE_SECRETS = ROOT / "deploy" / "k8s" / "overlays" / "example" / "secrets.yaml"
PASSWORD = "role-password-7f3a"


def doc_rules() -> dict[str, list[str]]:
    """role -> rule words, from the ``user ROLE on >PASSWORD ...`` lines of the docs."""
    rules = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words[:1] == ["user"] and ">PASSWORD" in words:
            rules[words[1]] = [w for w in words[2:] if w != ">PASSWORD"]
    return rules


def commands(rule: list[str]) -> set[str]:
    return {word[1:] for word in rule if word.startswith("+") and not word.startswith("+@")}


PUBSUB = {"publish", "subscribe", "psubscribe", "spublish", "ssubscribe"}


def check_channels(rule: list[str], used: set[str]) -> None:
    """Channels are denied (``resetchannels``) unless the role publishes or subscribes;
    then exactly the queues' channels (``&emq:*``) are allowed."""
    assert "resetchannels" in rule and "allchannels" not in rule
    granted = [word for word in rule if word.startswith("&")]
    assert granted == (["&emq:*"] if used & PUBSUB else []), (granted, sorted(used & PUBSUB))
    assert rule.index("resetchannels") < min((rule.index(w) for w in granted), default=99)


def without(rule: list[str], command: str) -> list[str]:
    return [word for word in rule if word != f"+{command}"]


@pytest.fixture
def server(private_redis: LocalRedis) -> LocalRedis:
    """A server of the test's own: its ACL users go with it."""
    return private_redis


def admin(server: LocalRedis) -> redis.Redis:
    return redis.Redis(port=server.port)


def set_user(server: LocalRedis, role: str, rule: list[str]) -> str:
    admin(server).execute_command("ACL", "SETUSER", role, "reset", "on", f">{PASSWORD}", *rule)
    return f"redis://{role}:{PASSWORD}@127.0.0.1:{server.port}/0"


def refusals(server: LocalRedis) -> list[dict[str, Any]]:
    return list(admin(server).acl_log())


class Monitor:
    """Every command the server runs (scripts' commands included), lower-case, with the
    subcommand for the commands that ACL rules name by subcommand."""

    SUBCOMMANDS = {"client", "script", "config"}
    EXEMPT = {"auth", "hello"}  # allowed to every user: how a client logs in

    def __init__(self, server: LocalRedis) -> None:
        self.seen: set[str] = set()
        self._conn = redis.Redis(port=server.port).monitor()
        self._conn.__enter__()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._conn.listen():
                words = event["command"].split()
                name = words[0].lower()
                if name in self.SUBCOMMANDS and len(words) > 1:
                    name = f"{name}|{words[1].lower()}"
                self.seen.add(name)
        except (redis.exceptions.ConnectionError, ValueError, OSError):
            return

    def stop(self) -> set[str]:
        """The commands seen so far, once an ECHO sent now has come through."""
        redis.Redis(port=self._conn.connection.port).echo("end")
        wait_until(lambda: "echo" in self.seen, 10, "the monitor to catch up")
        self._conn.connection.disconnect()
        return self.seen - self.EXEMPT - {"echo"}


def observe(server: LocalRedis, role: str, workload: Callable[[str], None]) -> set[str]:
    """The commands ``workload`` sends as ``role`` with every command allowed."""
    url = set_user(server, role, ["~emq:*", "&emq:*", "+@all"])
    monitor = Monitor(server)
    workload(url)
    return monitor.stop()


# ------------------------------------------------------------------- workloads


def producer_workload(floor: Floor) -> Callable[[str], None]:
    def run(url: str) -> None:
        q = echomq.Queue("acl-producer", redis_url=url)
        q.ping()
        job_id = q.add("send", {"n": 1}, lane="a")
        assert q.add("send", {"n": 1}, job_id=job_id) == job_id  # idempotent re-admit
        q.add("send", {"n": 2}, delay=3600)
        q.add_many([("send", {"n": 3}), ("send", {"n": 4}, {"delay": 60})])
        # an expiring job, and jobs waiting for others in more than one call: MULTI/EXEC
        q.add("send", {"n": 5}, expires=3600)
        first = q.add("send", {"n": 6})
        q.add_many([("send", {"i": i}, {"after": [first]}) for i in range(600)])
        assert q.get(job_id) is not None and q.get("missing") is None
        assert q.counts()["scheduled"] == 2 and q.stats()["waiting"] == 4
        # a queue whose supervisor runs "sync": deferred jobs are written through
        synced = echomq.Queue("acl-producer-sync", redis_url=url, floor=floor)
        synced.add("send", {}, delay=60)
        # results: one of a finished job, one waited for until its timeout (parked)
        done = echomq.Queue("acl-producer-results", redis_url=url)
        assert done.result("done-1", timeout=5) == {"ok": 1}
        with pytest.raises(TimeoutError):
            done.result("pending-1", timeout=0.05)
    return run


def producer_results(server: LocalRedis) -> None:
    """A finished job and a waiting one, made with the server's default user; and the
    producer's queue rung 64 times with nobody parked, so its next ring trims the list."""
    q = echomq.Queue("acl-producer-results", redis=admin(server))
    q.add("x", {}, job_id="done-1")
    echomq.Consumer(q, lambda job: {"ok": 1}).run(burst=True)
    q.add("x", {}, job_id="pending-1")
    admin(server).lpush(Keys("acl-producer").wake, *[b"1"] * 64)


def operator_queue(server: LocalRedis) -> None:
    """A queue as an operator finds it, made with the server's default user: waiting jobs
    in two lanes, a scheduled one, one spilled to the floor (its stub), two dead ones, one
    running (claimed, its lease held), its doorbell rung 64 times with nobody parked."""
    client = admin(server)
    q = echomq.Queue("acl-operator", redis=client, max_stalls=0)
    for lane in ("a", "b"):
        q.add("x", {}, lane=lane)
    q.add("x", {}, delay=3600)
    far = q.add("x", {}, delay=7200)
    due = int(client.hget(q.keys.job(far), "due_ms"))
    assert scripts.SPILL(client, [q.keys.schedule, q.keys.spilled],
                         [q.keys.prefix, "schedule", far, due]) == [1]
    dead = [q.add("x", {}, lane="c"), q.add("x", {}, lane="c")]
    lanes = Lanes(client, Keys("acl-operator"), q.settings)
    claimed = []
    while len(claimed) < 4:
        claimed += lanes.claim(4)
    held = [(c.id, c.token) for c in claimed if c.id in dead]
    scripts.release(client, Keys("acl-operator"), held, "stall")
    scripts.release(client, Keys("acl-operator"),
                    [(c.id, c.token) for c in claimed if c.id not in dead], "unstarted")
    busy = q.add("x", {}, lane="d")
    for _ in range(10):  # the ring turns lane by lane: the other lanes' jobs go back
        [c] = lanes.claim(1)
        if c.id == busy:
            break
        scripts.release(client, Keys("acl-operator"), [(c.id, c.token)], "unstarted")
    assert q.get(busy).state == "active"  # type: ignore[union-attr]
    client.lpush(q.keys.wake, *[b"1"] * 64)  # rung with nobody parked: the next ring trims


def operator_workload(url: str) -> None:
    """Inspection and repair from Python, every `echomq` command (a running job cancelled,
    the events read), and the dashboard's page, live stream and actions."""
    q = echomq.Queue("acl-operator", redis_url=url)
    q.ping()
    assert q.counts()["dead"] == 2 and q.stats()["dead"] == 2
    dead = q.dead()
    assert len(dead) == 2 and q.get(dead[0].id) is not None
    assert q.retry_dead([dead[0].id]) == 1
    assert q.retry_dead() == 1
    name = q.name
    waiting = [j.id for j in q.jobs("waiting", 10)]

    def cli(*argv: str) -> None:
        assert ops_cli.main(["--redis-url", url, "--json", *argv]) == 0, argv

    cli("queues")
    cli("stats", name)
    for state in echomq.STATES:
        cli("jobs", name, "--state", state, "--limit", "5")
    cli("show", name, waiting[0])
    cli("cancel", name, waiting[0])
    (running,) = [j.id for j in q.jobs("active", 10)]
    cli("cancel", name, running)  # stop.lua publishes it on the stop channel
    cli("events", name)
    cli("pause", name)
    cli("resume", name)
    cli("retry", name)
    for state in ("completed", "dead", "cancelled"):
        cli("purge", name, "--state", state)
    cli("crons", name)
    token = "operator-token-0123456789"
    board = Dashboard(redis.Redis.from_url(url), allow_actions=True, token=token)
    assert board.handle("GET", f"/?queue={name}")[0] == 200
    assert board.handle("GET", f"/?queue={name}&job={waiting[1]}")[0] == 200
    bearer = {"authorization": f"Bearer {token}"}
    for action in ({"action": "pause"}, {"action": "resume"}, {"action": "retry"},
                   {"action": "cancel", "job": waiting[1]}):
        body = urlencode({**action, "queue": name}).encode()
        assert board.handle("POST", "/action", body, bearer)[0] == 303, action
    live = board.stream(f"/events?queue={name}")  # from the newest event on
    assert b"counts" in next(live)
    live.close()
    live = board.stream(f"/events?queue={name}", "0-0-0")  # a reconnect: from the start
    next(live)
    assert b"cancelled while running" in next(live)
    live.close()


@pytest.fixture
def floor(tmp_path: Path, server: LocalRedis) -> Iterator[Floor]:
    floor = Floor.from_url(f"sqlite:///{tmp_path / 'floor.db'}")
    floor.upgrade()
    admin(server).hset(Keys("acl-producer-sync").meta, "durability", "sync")
    yield floor
    floor.dispose()


# ------------------------------------------------------------------ the rules


def test_docs_give_a_rule_per_role_and_the_manifests_use_them() -> None:
    rules = doc_rules()
    assert set(rules) == {"producer", "supervisor", "operator"}
    for role, rule in rules.items():
        assert rule[0] == "on" and "~emq:*" in rule and "-@all" in rule, role
        assert "-@dangerous" in rule, role
    docs = yaml.safe_load_all(EXAMPLE_SECRETS.read_text(encoding="utf-8"))
    (acl,) = [d for d in docs if d["metadata"]["name"] == "echomq-valkey-acl"]
    for line in acl["stringData"]["users.acl"].splitlines():
        words = line.split()
        if words[1] in rules:
            assert [w for w in words[2:] if not w.startswith(">")] == rules[words[1]], words[1]


def test_producer_rule_is_exactly_what_a_producer_sends(server: LocalRedis, floor: Floor) -> None:
    rule = doc_rules()["producer"]
    producer_results(server)
    used = observe(server, "producer", producer_workload(floor))
    assert used == commands(rule), (sorted(used - commands(rule)),
                                    sorted(commands(rule) - used))
    check_channels(rule, used)
    admin(server).flushall()
    admin(server).hset(Keys("acl-producer-sync").meta, "durability", "sync")
    producer_results(server)
    admin(server).acl_log_reset()
    producer_workload(floor)(set_user(server, "producer", rule))
    assert refusals(server) == []


def test_operator_rule_is_exactly_what_an_operator_sends(server: LocalRedis) -> None:
    rule = doc_rules()["operator"]
    operator_queue(server)
    used = observe(server, "operator", operator_workload)
    assert used == commands(rule), (sorted(used - commands(rule)),
                                    sorted(commands(rule) - used))
    check_channels(rule, used)
    admin(server).flushall()
    operator_queue(server)
    admin(server).acl_log_reset()
    operator_workload(set_user(server, "operator", rule))
    assert refusals(server) == []


@pytest.mark.parametrize("missing", ["evalsha", "zadd", "hgetall"])
def test_a_producer_rule_missing_a_command_names_it(
        server: LocalRedis, floor: Floor, missing: str) -> None:
    url = set_user(server, "producer", without(doc_rules()["producer"], missing))
    with pytest.raises(PermissionDenied) as caught:
        producer_workload(floor)(url)
    message = str(caught.value)
    assert f"'{missing}'" in message and "docs/security.md" in message
    assert PASSWORD not in message


def supervisor_workload(server: LocalRedis, role_url: str, tmp_path: Path,
                        run: Callable[..., Proc], ledger_url: str) -> Proc:
    """The supervisor with a floor: immediate, deferred, retried, spilled and stalled jobs,
    a lease extension, completed jobs past the retention, /readyz and /metrics, a drain."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    floor_url = f"sqlite:///{tmp_path / 'sup-floor.db'}"
    Floor.from_url(floor_url).upgrade()
    port = free_port()
    sup = run("start", "--redis-url", role_url, "--queue", "acl-sup", "--handler",
              "sup_jobs:record", "--processes", "2", "--floor-url", floor_url,
              "--beat-ms", "100", "--lease-ms", "600", "--spill-horizon", "30",
              "--health-port", str(port), env={"ECHOMQ_TEST_LEDGER_URL": ledger_url})
    q = echomq.Queue("acl-sup", redis=admin(server))
    # flow control (docs/flow-control.md): a lane limit that blocks and reopens the
    # default lane, a rate-limited lane and a priority level
    q.set_lane_limit("default", max_active=2)
    q.set_lane_limit("rated", rate=1000, per_s=1.0)
    ids_flow = [q.add("x", {}, lane="rated"), q.add("x", {}, priority=5),
                *q.add_many([("x", {}) for _ in range(5)])]
    wait_until(lambda: all(q.get(i).state == "completed" for i in ids_flow),  # type: ignore[union-attr]
               60, "the flow-controlled jobs")
    # the limits cleared, the rest is claimed without flow control: one lane, many jobs
    q.set_lane_limit("default")
    q.set_lane_limit("rated")
    # past the 1000 completed jobs a queue keeps: settling trims the oldest
    bulk = q.add_many([("x", {}) for _ in range(1001)])
    ids = [bulk[-1], q.add("x", {}, delay=0.2), q.add("x", {"fail_first": True}, backoff=0.1),
           q.add("x", {"sleep": 0.6})]
    q.add("x", {}, delay=3600)  # beyond the horizon: spilled to the floor
    wait_until(lambda: all(q.get(i).state == "completed" for i in ids),  # type: ignore[union-attr]
               60, "the supervisor's jobs")
    # alone, so no other claimed job shares its process: killed twice, released, buried
    crasher = q.add("x", {"exit": 1})
    wait_until(lambda: q.get(crasher).state == "dead", 30, "a stalled job")  # type: ignore[union-attr]
    wait_until(lambda: q.stats()["spilled"] == 1, 20, "a spill")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert b"echomq_queue_jobs" in resp.read()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
        assert resp.status == 200
    assert sup.stop() == 0
    return sup


def test_supervisor_rule_is_exactly_what_a_supervisor_sends(
        tmp_path: Path, redis_url: str, run_supervisor: Callable[..., Proc]) -> None:
    rule = doc_rules()["supervisor"]
    observed = LocalRedis().start()
    try:
        url = set_user(observed, "supervisor", ["~emq:*", "&emq:*", "+@all"])
        monitor = Monitor(observed)
        supervisor_workload(observed, url, tmp_path / "a", run_supervisor, redis_url)
        used = monitor.stop()
    finally:
        observed.stop()
    # CLIENT UNBLOCK (@dangerous) is left out of the rule on purpose: on a drain, a
    # doorbell that may not unblock its parked BLPOP closes that connection instead
    optional = {"client|unblock"}
    assert used - optional == commands(rule), (sorted(used - commands(rule)),
                                               sorted(commands(rule) - used))
    check_channels(rule, used)
    exact = LocalRedis().start()
    try:
        sup = supervisor_workload(exact, set_user(exact, "supervisor", rule), tmp_path / "b",
                                  run_supervisor, redis_url)
        refused = {entry["object"] for entry in refusals(exact)}
        assert refused <= optional and "NOPERM" not in sup.output, refused
    finally:
        exact.stop()


def test_a_supervisor_missing_a_command_names_it_and_recovers_without_a_restart(
        server: LocalRedis, redis_url: str, run_supervisor: Callable[..., Proc]) -> None:
    rule = doc_rules()["supervisor"]
    url = set_user(server, "supervisor", without(rule, "blpop"))
    sup = run_supervisor("start", "--redis-url", url, "--queue", "acl-sup", "--handler",
                         "sup_jobs:record", "--beat-ms", "100",
                         env={"ECHOMQ_TEST_LEDGER_URL": redis_url})
    line = sup.wait_for("'blpop'")
    assert "no permissions" in line and PASSWORD not in line
    admin(server).execute_command("ACL", "SETUSER", "supervisor", "+blpop")  # fixed live
    q = echomq.Queue("acl-sup", redis=admin(server))
    job_id = q.add("x", {})
    wait_until(lambda: q.get(job_id).state == "completed", 30,  # type: ignore[union-attr]
               "the job once the rule is fixed")
    assert sup.proc.poll() is None and sup.output.count("consumer") >= 1
    assert re.search(r"Traceback", sup.output) is None
