"""Operating a running supervisor: pause/resume at the idle budget, /metrics on
prometheus_client (parsed by its own parser), the dashboard on the health port."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable

import redis
from echomq.supervisor.drills.localredis import LocalRedis, free_port
from prometheus_client.parser import text_string_to_metric_families

import echomq

from .conftest import Supervisor, wait_until

Start = Callable[..., Supervisor]
OWN = ("config|resetstat", "config", "info")


def _window(r: redis.Redis, seconds: float) -> dict[str, int]:
    """Commands the server ran during a measurement window (scripts' inner calls included)."""
    r.config_resetstat()
    threading.Event().wait(seconds)  # a measurement window, not a wait for an event
    stats = r.info("commandstats")
    return {k[len("cmdstat_"):]: int(v["calls"]) for k, v in stats.items()
            if k[len("cmdstat_"):] not in OWN}


def test_pause_holds_jobs_at_the_idle_cost_and_resume_runs_them(
        supervisor: Start, queue_name: str, private_redis: LocalRedis) -> None:
    r = redis.Redis.from_url(private_redis.url)
    q = echomq.Queue(queue_name, redis=r)
    supervisor(private_redis.url, queue_name, "--processes", "2", "--beat-ms", "200").started(2)
    assert queue_name in echomq.Queue.registered(r)  # the supervisor registers what it serves
    q.add("warm", {})
    wait_until(lambda: q.counts()["completed"] == 1, 10, "the warm-up job")
    assert q.pause()
    idle = _window(r, 2.0)
    q.add_many([("held", {"i": i}) for i in range(20)])
    paused = _window(r, 2.0)
    assert q.counts()["waiting"] == 20 and q.counts()["completed"] == 1
    assert r.llen(f"ledger:{queue_name}:started") == 1
    # no consumer was woken: no claim leased anything. The claim a consumer parked on the
    # doorbell writes behind each park runs at the block's end, idle or paused: with work
    # waiting it checks the pause flag too (two EXISTS each; a supervisor without a
    # floor also looks for crons with one EXISTS every 5 beats, as in the idle window)
    assert "lmove" not in paused and "lpop" not in paused, f"a claim ran: {paused}"
    assert paused.get("exists", 0) <= idle.get("exists", 0) + 1 + 2 * paused.get("evalsha", 0), (
        idle, paused)
    # the same idle cost (margin: one safety promote and one reap falling in one window only)
    assert sum(paused.values()) <= sum(idle.values()) + 10, (idle, paused)
    assert q.resume()
    wait_until(lambda: q.counts()["completed"] == 21, 15, "the held jobs after resume")


def _get(url: str, data: bytes | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_metrics_parse_with_prometheus_client(supervisor: Start, queue_name: str,
                                              redis_url: str) -> None:
    port = free_port()
    q = echomq.Queue(queue_name, redis_url=redis_url)
    supervisor(redis_url, queue_name, "--processes", "2", "--beat-ms", "200",
               "--health-port", str(port)).started(2)
    q.add_many([("mail", {}) for _ in range(4)] + [("flaky", {"fail_first": True})])
    wait_until(lambda: q.counts()["completed"] == 5, 20, "5 completions")
    base = f"http://127.0.0.1:{port}"

    def families() -> dict[str, object]:
        code, text = _get(base + "/metrics")
        assert code == 200
        return {f.name: f for f in text_string_to_metric_families(text)}

    wait_until(lambda: any(s.labels.get("name") == "flaky" and s.value == 1 and
                           s.labels["outcome"] == "completed"
                           for s in families()["echomq_jobs_finished"].samples),  # type: ignore[attr-defined]
               10, "the children's observations in /metrics")
    fams = families()
    samples = {f: fams[f].samples for f in fams}  # type: ignore[attr-defined]
    finished = {(s.labels["name"], s.labels["outcome"]): s.value
                for s in samples["echomq_jobs_finished"] if s.name.endswith("_total")}
    assert finished == {("mail", "completed"): 4, ("flaky", "failed"): 1,
                        ("flaky", "completed"): 1}
    assert fams["echomq_job_duration_seconds"].type == "histogram"  # type: ignore[attr-defined]
    counts = {s.labels["name"]: s.value for s in samples["echomq_job_duration_seconds"]
              if s.name.endswith("_count") and s.labels["queue"] == queue_name}
    assert counts == {"mail": 4, "flaky": 2}
    pickups = [s for s in samples["echomq_pickup_latency_seconds"]
               if s.name.endswith("_count") and s.labels["queue"] == queue_name]
    assert sum(s.value for s in pickups) == 5  # first attempts only
    depth = {s.labels["state"]: s.value for s in samples["echomq_queue_jobs"]
             if s.labels["queue"] == queue_name}
    assert depth["waiting"] == 0 and depth["cancelled"] == 0 and "spilled" in depth
    rss = [s.value for s in samples["echomq_consumer_rss_bytes"]
           if s.labels["queue"] == queue_name]
    assert rss and rss[0] > 0
    assert any(s.labels["queue"] == queue_name for s in samples["echomq_consumer_restarts"])
    assert any(s.labels["queue"] == queue_name for s in samples["echomq_oldest_waiting_seconds"])
    assert [s.value for s in samples["echomq_queue_paused"]
            if s.labels["queue"] == queue_name] == [0]
    assert [s.value for s in samples["echomq_up"]] == [1]


def test_dashboard_on_the_health_port(supervisor: Start, queue_name: str,
                                      redis_url: str) -> None:
    port, plain = free_port(), free_port()
    q = echomq.Queue(queue_name, redis_url=redis_url)
    q.add("x", {})
    supervisor(redis_url, queue_name, "--processes", "1", "--health-port", str(port),
               "--dashboard").started(1)
    wait_until(lambda: _get(f"http://127.0.0.1:{port}/livez")[0] == 200, 10, "health up")
    code, page = _get(f"http://127.0.0.1:{port}/?queue={queue_name}")
    assert code == 200 and f'data-queue="{queue_name}"' in page and "read-only" in page
    assert _get(f"http://127.0.0.1:{port}/action", b"action=pause&queue=" +
                queue_name.encode())[0] == 403
    supervisor(redis_url, queue_name, "--processes", "1", "--health-port", str(plain)).started(1)
    wait_until(lambda: _get(f"http://127.0.0.1:{plain}/livez")[0] == 200, 10, "health up")
    assert _get(f"http://127.0.0.1:{plain}/")[0] == 404
