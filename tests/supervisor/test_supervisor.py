"""The supervisor as users run it: a subprocess, real forked consumers, real signals."""

from __future__ import annotations

import json
import signal
import statistics
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable

import psutil
import redis
from echomq.supervisor.cli import EXIT_USAGE
from echomq.supervisor.drills.localredis import LocalRedis, free_port
from echomq.supervisor.metronome import PARK_BEATS

import echomq

from .conftest import CLI, ROOT, Supervisor, readyz, wait_until

Start = Callable[..., Supervisor]


def _ran(r: redis.Redis, queue: str) -> Counter[str]:
    return Counter(x.decode() for x in r.lrange(f"ledger:{queue}:done", 0, -1))


def _children(sup: Supervisor) -> list[int]:
    return [c.pid for c in psutil.Process(sup.proc.pid).children()]


def test_5000_jobs_across_50_lanes_complete_exactly_once(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", {}, {"lane": f"lane-{i % 50}"}) for i in range(5000)])
    supervisor(redis_url, queue_name, "--processes", "4").started(4)
    wait_until(lambda: q.counts()["completed"] == 5000, 60, "5000 completions")
    ran = _ran(r, queue_name)
    assert set(ran) == set(ids) and set(ran.values()) == {1}
    assert q.counts() == {"waiting": 0, "scheduled": 0, "active": 0, "completed": 5000,
                          "dead": 0, "cancelled": 0, "blocked": 0}


def test_sigkill_a_child_mid_job_requeues_and_respawns(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "2").started(2)
    job_id = q.add("x", {"sleep": 2})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the job to start")
    _, pid, _ = r.lindex(f"ledger:{queue_name}:started", 0).decode().split(":")
    before = set(_children(sup))
    psutil.Process(int(pid)).kill()
    sup.wait_for_log(rf"consumer {pid} killed by SIGKILL, released 1 job")
    wait_until(lambda: _ran(r, queue_name)[job_id] == 1, 15, "the requeued job to run")
    # the handler writes the ledger before its outcome settles: wait for the settle too
    wait_until(lambda: q.get(job_id).state == "completed", 5, "the requeued job to settle")
    job = q.get(job_id)
    assert job is not None and job.stalls == 1 and _ran(r, queue_name)[job_id] == 1
    assert job.attempts == 2
    wait_until(lambda: len(_children(sup)) == 2, 10, "a respawned consumer")
    assert int(pid) not in _children(sup) and set(_children(sup)) != before


def test_a_job_that_kills_its_process_backs_off_then_goes_dead(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = [q.add("x", {"exit": 1}) for _ in range(2)]
    sup = supervisor(redis_url, queue_name, "--processes", "1")
    wait_until(lambda: q.counts()["dead"] == 2, 20, "both jobs dead after max_stalls")
    delays = [float(x) for x in
              (line.split("respawn in ")[1].rstrip("s") for line in
               sup.wait_for_log(r"respawn in", 3))]
    assert delays[:3] == [0.25, 0.5, 1.0]  # doubling, not a spin
    for job_id in ids:
        job = q.dead()
        assert job_id in [j.id for j in job]
    assert "stalled 2 times" in (q.dead()[0].error or "")
    # 1 + 4 respawns, not hundreds
    assert len(sup.wait_for_log(r"consumer \d+ started", 5, timeout=10)) == 5
    # a healthy job afterwards runs: the slot recovered
    ok = q.add("x", {})
    wait_until(lambda: _ran(r, queue_name)[ok] == 1, 15, "a healthy job after the crashes")


def test_sigterm_lets_running_jobs_finish_and_exits_zero(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "2").started(2)
    ids = q.add_many([("x", {"sleep": 1}) for _ in range(6)])
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 2, 10, "two running jobs")
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == 0
    counts = q.counts()
    assert counts["active"] == 0 and counts["completed"] == 2
    assert counts["waiting"] == 4  # not started: still queued, nothing lost
    assert sum(_ran(r, queue_name).values()) == 2
    assert {j.state for j in map(q.get, ids)} == {"completed", "waiting"}


def test_drain_timeout_kills_and_requeues(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1",
                     "--drain-timeout", "0.5").started(1)
    job_id = q.add("x", {"sleep": 30})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the long job")
    t0 = time.monotonic()
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0
    assert time.monotonic() - t0 < 5
    job = q.get(job_id)
    assert job is not None and job.state == "waiting" and job.stalls == 1  # a drain kill


def test_a_job_longer_than_its_lease_is_not_reaped(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "2", "--lease-ms", "400",
               "--beat-ms", "100").started(2)
    job_id = q.add("x", {"sleep": 2})
    wait_until(lambda: _ran(r, queue_name)[job_id] == 1, 15, "the long job")
    assert r.llen(f"ledger:{queue_name}:started") == 1  # never reaped, never run twice
    job = q.get(job_id)
    assert job is not None and job.stalls == 0 and job.attempts == 1


def test_idle_supervisor_stays_within_the_beat_budget(supervisor: Start, queue_name: str,
                                                      private_redis: LocalRedis,
                                                      doorbell: str) -> None:
    url = private_redis.url
    r = redis.Redis.from_url(url)
    port = free_port()
    beat_s = 0.2
    supervisor(url, queue_name, "--processes", "8", "--beat-ms", str(int(beat_s * 1000)),
               "--doorbell", doorbell, "--health-port", str(port)).started(8)
    wait_until(lambda: int(r.info("clients")["blocked_clients"]) == 1, 10, "the metronome")
    wait_until(lambda: _ready_children(port, queue_name) == 8, 20, "every consumer's READY")
    # each consumer's first claim (an EVALSHA on the empty ring) is start-up, not idle cost
    wait_until(lambda: int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
               >= 8, 10, "every consumer's first claim")
    threading_event_wait(0.3)  # let the startup pokes settle before counting
    r.config_resetstat()
    t0 = time.monotonic()
    threading_event_wait(4.0)
    stats = r.info("commandstats")
    elapsed = time.monotonic() - t0
    calls = {k: v["calls"] for k, v in stats.items()}
    calls.pop("cmdstat_config", None)
    calls.pop("cmdstat_info", None)
    beats = elapsed / beat_s + 1
    parks_at_most = elapsed / (beat_s * PARK_BEATS) + 1
    # one BLPOP (BZPOPMIN) per park of several beats, whatever the number of consumers;
    # reap and promote only when a lease or schedule head can be due (here nothing is),
    # or as a rare safety pass; crons are looked for every few beats
    parks = "cmdstat_blpop" if doorbell == "list" else "cmdstat_bzpopmin"
    assert 1 <= calls.get(parks, 0) <= parks_at_most, calls
    # a consumer parked on the doorbell writes a claim behind each park, which the server
    # runs at the block's end: on an empty queue an EVALSHA and its one EXISTS
    claims_behind = min(calls.get("cmdstat_evalsha", 0), calls[parks])
    assert sum(calls.values()) - 2 * claims_behind <= beats, calls
    r.close()


def _ready_children(port: int, queue: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 until ready
        body = json.loads(exc.read())
    except OSError:
        return 0  # not listening yet
    return int(body.get("queues", {}).get(queue, {}).get("children", 0))


def test_one_job_on_an_idle_queue_wakes_one_consumer(supervisor: Start, queue_name: str,
                                                     private_redis: LocalRedis,
                                                     doorbell: str) -> None:
    url = private_redis.url
    r = redis.Redis.from_url(url)
    supervisor(url, queue_name, "--processes", "4", "--doorbell", doorbell).started(4)
    q = echomq.Queue(queue_name, redis=r)
    wait_until(lambda: int(r.info("clients")["blocked_clients"]) == 1, 10, "the metronome")
    threading_event_wait(0.3)  # let the startup pokes settle before counting
    r.config_resetstat()
    q.add("x", {})
    wait_until(lambda: q.counts()["completed"] == 1, 10, "the job")
    threading_event_wait(0.3)
    claims = r.info("commandstats").get("cmdstat_lmove", {}).get("calls", 0)
    assert claims <= 2, claims  # its claim and the empty one after it; not one per process


def threading_event_wait(seconds: float) -> None:
    """Let wall-clock time pass while the system under test is idle: that is the measurement."""
    import threading

    threading.Event().wait(seconds)


def test_pickup_latency_on_an_idle_queue(supervisor: Start, redis_url: str, queue_name: str,
                                         r: redis.Redis, doorbell: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "2", "--doorbell", doorbell).started(2)
    wait_until(lambda: q.counts()["waiting"] == 0, 5, "startup")
    stamps = f"ledger:{queue_name}:stamps"
    latencies = []
    for _ in range(20):
        t0 = time.time()
        q.add("x", {"stamp": True})
        _, started = r.blpop([stamps], 5)
        latencies.append(float(started) - t0)
    assert statistics.median(latencies) < 0.020, latencies


def test_readyz_turns_unready_when_valkey_stops(supervisor: Start, queue_name: str,
                                                private_redis: LocalRedis) -> None:
    port = free_port()
    supervisor(private_redis.url, queue_name, "--processes", "1", "--health-port", str(port),
               "--beat-ms", "200").started(1)
    base = f"http://127.0.0.1:{port}"

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    wait_until(lambda: status("/readyz") == 200, 10, "ready")
    assert status("/livez") == 200
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert f'echomq_queue_jobs{{queue="{queue_name}",state="waiting"}} 0.0' in text
    private_redis.pause()
    try:
        wait_until(lambda: status("/readyz") == 503, 10, "unready while Valkey is stopped")
        assert status("/livez") == 200  # the loop itself is alive
    finally:
        private_redis.resume()
    wait_until(lambda: status("/readyz") == 200, 15, "ready again")
    with urllib.request.urlopen(base + "/readyz", timeout=5) as resp:
        assert json.loads(resp.read())["valkey"] == "ok"


def test_metrics_answer_while_valkey_is_frozen_with_many_queues(
        supervisor: Start, queue_name: str, private_redis: LocalRedis) -> None:
    """Valkey stopped (SIGSTOP): each queue's read waits out its socket timeout. The
    scrape leaves the queues out once its budget is spent and answers, saying
    echomq_up 0, instead of running past its connection's bound (cut, no answer)."""
    names = [f"{queue_name}-{i}" for i in range(8)]
    port = free_port()
    supervisor(private_redis.url, ",".join(names), "--processes", "1", "--health-port",
               str(port), "--beat-ms", "200").started(len(names))
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        assert "echomq_up 1.0" in resp.read().decode()
    private_redis.pause()
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert "echomq_up 0.0" in text
    finally:
        private_redis.resume()


def test_start_fails_at_once_when_the_handler_cannot_be_imported(redis_url: str) -> None:
    import subprocess

    for spec, needle in (("no_such_module_xyz:handle", "no_such_module_xyz"),
                         ("sup_jobs:missing", "no attribute 'missing'")):
        t0 = time.monotonic()
        done = subprocess.run([*CLI, "start", "--redis-url", redis_url, "--queue", "q",
                               "--handler", spec], cwd=ROOT, capture_output=True, text=True,
                              timeout=30, env={"PYTHONPATH": f"{ROOT}/tests/supervisor:{ROOT}",
                                               "PATH": "/usr/bin:/bin"})
        # refused as a usage error before anything starts: one line saying why, no
        # traceback, and not a consumer that crashes and is respawned
        assert done.returncode == EXIT_USAGE
        assert needle in done.stderr and "Traceback" not in done.stderr
        assert time.monotonic() - t0 < 10


def test_starts_from_environment_alone_like_a_container(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    port = free_port()
    env = {"ECHOMQ_REDIS_URL": redis_url, "ECHOMQ_QUEUE": queue_name,
           "ECHOMQ_HANDLER": "sup_jobs:record", "ECHOMQ_PROCESSES": "2",
           "ECHOMQ_HEALTH_PORT": str(port), "ECHOMQ_DRAIN_TIMEOUT": "5",
           "ECHOMQ_BEAT_MS": "200", "ECHOMQ_LOG_JSON": "1"}
    sup = supervisor(redis_url, queue_name, env=env, flags=False)
    sup.wait_for_log(r'"event": "spawn"', 2)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"sleep": 0.5})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the job to start")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
        assert resp.status == 200
    t0 = time.monotonic()
    sup.signal(signal.SIGTERM)  # what the kubelet sends PID 1
    assert sup.wait(15) == 0
    assert time.monotonic() - t0 < 5  # well inside the drain timeout
    assert _ran(r, queue_name)[job_id] == 1
    events = [json.loads(line)["event"] for line in sup.lines if line.startswith("{")]
    assert events[0] == "start" and "drain" in events and events[-1] == "exit"


def test_several_queues_in_one_supervisor(supervisor: Start, redis_url: str, queue_name: str,
                                          r: redis.Redis) -> None:
    other = queue_name + "-b"
    sup = supervisor(redis_url, queue_name, "--queue", other, "--processes", "1",
                     "--processes", "2").started(3)
    assert len(sup.wait_for_log(rf"queue {other}: consumer \d+ started", 2)) == 2
    qa = echomq.Queue(queue_name, redis_url=redis_url)
    qb = echomq.Queue(other, redis_url=redis_url)
    a = qa.add_many([("x", {}) for _ in range(50)])
    b = qb.add_many([("x", {}) for _ in range(50)])
    wait_until(lambda: qa.counts()["completed"] == 50 and qb.counts()["completed"] == 50, 20,
               "both queues")
    assert set(_ran(r, queue_name)) == set(a) and set(_ran(r, other)) == set(b)


def test_max_jobs_recycles_consumers_without_losing_work(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    ids = q.add_many([("x", {}) for _ in range(100)])
    sup = supervisor(redis_url, queue_name, "--processes", "2", "--max-jobs", "10")
    wait_until(lambda: q.counts()["completed"] == 100, 30, "100 completions")
    ran = _ran(r, queue_name)
    assert set(ran) == set(ids) and set(ran.values()) == {1}
    exits = sup.wait_for_log(r"consumer \d+ exited with 4", 8)
    assert len(exits) >= 8  # each process ran at most 10 jobs, then was replaced
    assert "respawn in" not in sup.log  # a recycle is not a crash


def test_sighup_rolls_every_consumer(supervisor: Start, redis_url: str, queue_name: str,
                                     r: redis.Redis) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "2").started(2)
    wait_until(lambda: len(_children(sup)) == 2, 10, "two consumers")
    before = set(_children(sup))
    job_id = q.add("x", {"sleep": 0.5})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the job to start")
    sup.signal(signal.SIGHUP)
    sup.wait_for_log(r"SIGHUP: rolling")
    wait_until(lambda: len(_children(sup)) == 2 and not before & set(_children(sup)), 15,
               "two new consumers")
    wait_until(lambda: _ran(r, queue_name)[job_id] == 1, 10, "the running job to finish")
    assert r.llen(f"ledger:{queue_name}:started") == 1  # finished, not killed and rerun


def test_sigusr2_prints_every_thread_s_stack_and_changes_nothing(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    """SIGUSR2 to the supervisor, and to a consumer in the middle of a job: each prints
    its threads' stacks (the consumer's shows the handler it is in) and goes on."""
    q = echomq.Queue(queue_name, redis_url=redis_url)
    sup = supervisor(redis_url, queue_name, "--processes", "1").started(1)
    job_id = q.add("x", {"gate": True})
    wait_until(lambda: r.llen(f"ledger:{queue_name}:started") == 1, 10, "the job to start")
    [child] = _children(sup)
    sup.signal(signal.SIGUSR2)
    sup.wait_for_log(r"^Current thread 0x")  # one per process
    # its frames follow that header, each a line of its own that may still be on its way
    sup.wait_for_log(r'arbiter\.py", line \d+')
    psutil.Process(child).send_signal(signal.SIGUSR2)
    sup.wait_for_log(r"^Current thread 0x", 2)
    sup.wait_for_log(r'sup_jobs\.py", line \d+ in record')  # the job's frame
    r.rpush(f"ledger:{queue_name}:gate", 1)
    wait_until(lambda: _ran(r, queue_name)[job_id] == 1, 10, "the job to finish")
    assert _children(sup) == [child] and sup.proc.poll() is None  # both went on
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == 0


def test_sync_dial_writes_a_retry_to_the_floor_at_once(
        supervisor: Start, redis_url: str, queue_name: str, tmp_path: object) -> None:
    import subprocess

    from echomq.floor import Floor

    floor_url = f"sqlite:///{tmp_path}/floor.db"
    subprocess.run([*CLI, "migrate", "--floor-url", floor_url], check=True, cwd=ROOT,
                   capture_output=True)
    # a long beat: the scheduler's own fold would come seconds later
    sup = supervisor(redis_url, queue_name, "--processes", "1", "--floor-url", floor_url,
               "--durability", "sync", "--beat-ms", "10000").started(1)
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {"fail_first": True}, backoff=600)
    floor = Floor.from_url(floor_url)
    wait_until(lambda: q.get(job_id).state == "scheduled", 5, "the retry")  # type: ignore[union-attr]
    try:
        wait_until(lambda: floor.count(queue_name) == 1, 6, "the retry's floor row")
    except AssertionError:
        print(sup.log)
        raise
    [row] = floor.open_rows(queue_name, None, 5)
    assert row.job_id == job_id and row.fields["attempts"] == "1"
    floor.dispose()


def test_start_refuses_a_floor_that_is_not_migrated(redis_url: str, tmp_path: object) -> None:
    import subprocess

    floor_url = f"sqlite:///{tmp_path}/empty.db"
    done = subprocess.run([*CLI, "start", "--redis-url", redis_url, "--queue", "q",
                           "--handler", "sup_jobs:record", "--floor-url", floor_url],
                          cwd=ROOT, capture_output=True, text=True, timeout=30,
                          env={"PYTHONPATH": f"{ROOT}/tests/supervisor:{ROOT}",
                               "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "echomq-supervisor migrate --floor-url" in done.stderr


def test_a_floor_outage_shows_in_readyz_and_metrics(
        supervisor: Start, redis_url: str, queue_name: str, tmp_path: object) -> None:
    import sqlite3
    import subprocess

    path = f"{tmp_path}/floor.db"
    subprocess.run([*CLI, "migrate", "--floor-url", f"sqlite:///{path}"], check=True,
                   cwd=ROOT, capture_output=True)
    port = free_port()
    supervisor(redis_url, queue_name, "--processes", "1", "--floor-url", f"sqlite:///{path}",
               "--beat-ms", "100", "--health-port", str(port)).started(1)
    base = f"http://127.0.0.1:{port}"

    wait_until(lambda: readyz(base)["queues"][queue_name].get("floor") == "ok", 10, "floor ok")
    lock = sqlite3.connect(path, timeout=1)
    lock.execute("BEGIN EXCLUSIVE")  # every writer now waits out its busy timeout and fails
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {}, delay=0.5)  # a deferred job for the scheduler to fold
    try:
        wait_until(lambda: readyz(base)["queues"][queue_name]["floor"].startswith("down"), 10,
                   "the outage in /readyz")
        assert readyz(base)["ready"] is True  # the queue keeps running on Valkey alone
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            assert f'echomq_floor_up{{queue="{queue_name}"}} 0.0' in resp.read().decode()
        wait_until(lambda: q.get(job_id).state == "completed", 10,  # type: ignore[union-attr]
                   "the job to run during the outage")
    finally:
        lock.rollback()
        lock.close()
    wait_until(lambda: readyz(base)["queues"][queue_name]["floor"] == "ok", 15, "floor back")


def test_start_refuses_a_queue_whose_consumers_park_on_the_other_doorbell(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis) -> None:
    import subprocess

    from echomq.keys import Keys

    r.hset(Keys(queue_name).meta, "doorbell", "list")
    done = subprocess.run([*CLI, "start", "--redis-url", redis_url, "--queue", queue_name,
                           "--handler", "sup_jobs:record", "--doorbell", "marker"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30,
                          env={"PYTHONPATH": f"{ROOT}/tests/supervisor:{ROOT}",
                               "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "park on the 'list' doorbell" in done.stderr and "--switch-doorbell" in done.stderr
    assert r.hget(Keys(queue_name).meta, "doorbell") == b"list"
    # the explicit switch: recorded, and the queue runs on the marker
    q = echomq.Queue(queue_name, redis_url=redis_url)
    job_id = q.add("x", {})
    supervisor(redis_url, queue_name, "--processes", "1", "--doorbell", "marker",
               "--switch-doorbell").started(1)
    wait_until(lambda: _ran(r, queue_name)[job_id] == 1, 10, "the job admitted before")
    assert r.hget(Keys(queue_name).meta, "doorbell") == b"marker"
    wait_until(lambda: int(r.info("clients")["blocked_clients"]) >= 1, 10, "the metronome")
    later = q.add("x", {})
    wait_until(lambda: _ran(r, queue_name)[later] == 1, 10, "a job rung on the marker")


def test_delayed_jobs_start_on_the_metronome_timer_not_the_beat(
        supervisor: Start, redis_url: str, queue_name: str, r: redis.Redis,
        doorbell: str) -> None:
    q = echomq.Queue(queue_name, redis_url=redis_url)
    # a long beat: a delayed job that waited for the safety pump would start seconds late
    supervisor(redis_url, queue_name, "--processes", "1", "--beat-ms", "5000",
               "--doorbell", doorbell).started(1)
    wait_until(lambda: int(r.info("clients")["blocked_clients"]) >= 1, 10, "the metronome")
    stamps = f"ledger:{queue_name}:stamps"
    lateness = []
    for delay in (0.3, 0.6):
        due = time.time() + delay
        q.add("x", {"stamp": True}, delay=delay)
        _, started = r.blpop([stamps], 10)
        lateness.append(float(started) - due)
    assert all(-0.01 < late < 1.0 for late in lateness), lateness


def test_the_lease_pass_reads_no_claims_record_while_the_consumers_are_idle(
        supervisor: Start, queue_name: str, private_redis: LocalRedis) -> None:
    # the lease pass (every third of a lease) reads a consumer's claims record only while it
    # may have a claim's reply unread (busy, or holding jobs): an idle supervisor sends
    # nothing for it, however many consumers it has
    url = private_redis.url
    r = redis.Redis.from_url(url)
    q = echomq.Queue(queue_name, redis_url=url)
    port = free_port()
    supervisor(url, queue_name, "--processes", "4", "--lease-ms", "600",
               "--health-port", str(port)).started(4)
    ids = q.add_many([("x", {}) for _ in range(40)])
    wait_until(lambda: all(q.get(i).state == "completed" for i in ids),  # type: ignore[union-attr]
               20, "the jobs")

    def all_idle() -> bool:  # every consumer has reported idle after its drain
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return f'echomq_consumers_busy{{queue="{queue_name}"}} 0.0' in text

    wait_until(all_idle, 10, "the consumers to report idle")
    r.config_resetstat()
    threading_event_wait(2.0)  # ten lease passes
    stats = r.info("commandstats")
    assert "cmdstat_lrange" not in stats and "cmdstat_pexpire" not in stats, stats
    r.close()
