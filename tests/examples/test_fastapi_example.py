"""examples/fastapi: its test client (httpx) against the session's server and a real
supervisor running the example's tasks."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def example(redis_url: str) -> Iterator[ModuleType]:
    """The example app, its queue named for this module's tests."""
    saved = {k: os.environ.get(k) for k in ("REPORTS_QUEUE", "ECHOMQ_REDIS_URL")}
    os.environ["REPORTS_QUEUE"] = f"reports-{uuid.uuid4().hex[:8]}"
    os.environ["ECHOMQ_REDIS_URL"] = redis_url
    sys.path.insert(0, str(ROOT))
    try:
        for name in ("examples.fastapi.app", "examples.fastapi.tasks"):
            sys.modules.pop(name, None)
        yield importlib.import_module("examples.fastapi.app")
    finally:
        sys.path.remove(str(ROOT))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def supervisor(example: ModuleType, redis_url: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "ECHOMQ_REDIS_URL": redis_url}
    env.pop("ECHOMQ_FLOOR_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq.supervisor.cli", "start", "--tasks",
         "examples.fastapi.tasks", "--processes", "2"], cwd=ROOT, env=env)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


@pytest.fixture
def client(example: ModuleType, supervisor: subprocess.Popen[bytes]) -> Iterator[TestClient]:
    with TestClient(example.app) as c:  # runs the lifespan: one aio.Queue for the app
        yield c


def test_a_request_adds_a_job_and_awaits_its_result(client: TestClient) -> None:
    answer = client.post("/reports", params={"wait": 60}, json={"rows": 4})
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == {"rows": 4, "total": 6}
    job = client.get(f"/reports/{answer.json()['job']}").json()
    assert job["state"] == "completed" and job["progress"] == {"done": 4, "of": 4}


def test_a_job_s_progress_streams_as_server_sent_events(client: TestClient) -> None:
    added = client.post("/reports", json={"rows": 5, "seconds_per_row": 0.2})
    assert added.status_code == 202
    job_id = added.json()["job"]
    with client.stream("GET", f"/reports/{job_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = _parse("".join(stream.iter_text()))
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "completed" and events[-1][1] == {"rows": 5, "total": 10}
    progress = [data["done"] for kind, data in events if kind == "progress"]
    assert progress and progress == sorted(set(progress)) and progress[-1] == 5


def test_unknown_and_invalid_ids_and_bad_input_are_refused(client: TestClient) -> None:
    assert client.get("/reports/no-such-job").status_code == 404
    assert client.get("/reports/not a job!").status_code == 422
    assert client.get("/reports/no-such-job/events").status_code == 404
    assert client.post("/reports", json={"rows": -1}).status_code == 422


def _parse(body: str) -> list[tuple[str, object]]:
    events = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events
