"""TLS end to end on a TLS-only redis-server with certificates made here: the producer,
the supervisor (its command, blocking and health connections, and its forked
consumers) all connect with rediss://; verification is on by default and a bad
certificate fails with a message that says so."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
import redis
from echomq.supervisor.drills.localredis import LocalRedis, free_port
from redis.backoff import NoBackoff
from redis.retry import Retry

import echomq
from echomq.connection import client_from_url
from echomq.ops import cli as ops_cli

from .certs import Certs
from .conftest import Proc, tls_server, wait_until


def _url(server: LocalRedis, ca: object) -> str:
    return f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={ca}"


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_server_speaks_tls_only(tls_redis: LocalRedis) -> None:
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis(port=tls_redis.port, socket_timeout=2,
                    retry=Retry(NoBackoff(), 0)).ping()


def test_admit_supervisor_result_over_tls(
        tls_redis: LocalRedis, certs: Certs, queue_name: str,
        run_supervisor: Callable[..., Proc]) -> None:
    url = _url(tls_redis, certs.ca)
    port = free_port()
    sup = run_supervisor("start", "--redis-url", url, "--queue", queue_name,
                         "--handler", "sup_jobs:record", "--processes", "2",
                         "--beat-ms", "200", "--health-port", str(port),
                         env={"ECHOMQ_TEST_LEDGER_URL": url})
    q = echomq.Queue(queue_name, redis_url=url)
    now = [q.add("x", {"n": n}) for n in range(10)]
    later = q.add("x", {}, delay=0.3)  # promoted by the metronome over TLS
    retried = q.add("x", {"fail_first": True}, backoff=0.2)  # failed, retried, completed
    ids = [*now, later, retried]
    wait_until(lambda: all(q.get(i).state == "completed" for i in ids),  # type: ignore[union-attr]
               30, "every job over TLS")
    assert q.get(retried).attempts == 2  # type: ignore[union-attr]
    assert q.result(now[0], timeout=10) == "ok"  # the result, read over TLS
    assert _get(f"http://127.0.0.1:{port}/readyz") == 200  # the health server's client too
    assert sup.stop() == 0
    assert "Traceback" not in sup.output


def test_verification_is_on_by_default(tls_redis: LocalRedis) -> None:
    q = echomq.Queue("q", redis_url=f"rediss://127.0.0.1:{tls_redis.port}/0")
    with pytest.raises(echomq.ConnectionFailed, match="certificate verify failed"):
        q.ping()


def test_a_wrong_ca_fails_with_a_clear_message(tls_redis: LocalRedis, certs: Certs) -> None:
    q = echomq.Queue("q", redis_url=_url(tls_redis, certs.other_ca))
    with pytest.raises(echomq.ConnectionFailed) as caught:
        q.ping()
    message = str(caught.value)
    assert "certificate verify failed" in message
    assert "ssl_ca_certs" in message and "ECHOMQ_REDIS_TLS_CA_FILE" in message


def test_a_supervisor_with_a_wrong_ca_says_why_and_keeps_retrying(
        tls_redis: LocalRedis, certs: Certs, queue_name: str,
        run_supervisor: Callable[..., Proc]) -> None:
    sup = run_supervisor("start", "--redis-url", _url(tls_redis, certs.other_ca),
                         "--queue", queue_name, "--handler", "sup_jobs:record",
                         "--beat-ms", "100", env={"ECHOMQ_TEST_LEDGER_URL": "redis://unused"})
    line = sup.wait_for("certificate verify failed")
    assert "unreachable" in line
    sup.wait_for(f"queue {queue_name}: Valkey unreachable", 20)
    assert sup.proc.poll() is None, "a certificate problem must not crash-loop the supervisor"


def test_client_certificates_from_the_environment(
        certs: Certs, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = tls_server(certs, client_certs="yes")
    try:
        url = f"rediss://127.0.0.1:{server.port}/0"
        monkeypatch.setenv("ECHOMQ_REDIS_TLS_CA_FILE", str(certs.ca))
        with pytest.raises(echomq.ConnectionFailed):
            echomq.Queue(queue_name, redis_url=url).ping()  # no client certificate
        monkeypatch.setenv("ECHOMQ_REDIS_TLS_CERT_FILE", str(certs.client_cert))
        monkeypatch.setenv("ECHOMQ_REDIS_TLS_KEY_FILE", str(certs.client_key))
        q = echomq.Queue(queue_name, redis_url=url)
        job_id = q.add("x", {"n": 1})
        assert q.get(job_id).state == "waiting"  # type: ignore[union-attr]
        # the URL's own query wins over the environment
        wrong = f"{url}?ssl_ca_certs={certs.other_ca}"
        with pytest.raises(echomq.ConnectionFailed, match="certificate verify failed"):
            echomq.Queue(queue_name, redis_url=wrong).ping()
    finally:
        server.stop()


def test_client_certificates_in_the_url_reach_every_supervisor_connection(
        certs: Certs, queue_name: str, run_supervisor: Callable[..., Proc]) -> None:
    server = tls_server(certs, client_certs="yes")
    try:
        url = (f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={certs.ca}"
               f"&ssl_certfile={certs.client_cert}&ssl_keyfile={certs.client_key}")
        run_supervisor("start", "--redis-url", url, "--queue", queue_name,
                       "--handler", "sup_jobs:record", "--processes", "1", "--beat-ms", "200",
                       env={"ECHOMQ_TEST_LEDGER_URL": url})
        q = echomq.Queue(queue_name, redis_url=url)
        ids = [q.add("x", {}), q.add("x", {}, delay=0.2)]
        wait_until(lambda: all(q.get(i).state == "completed" for i in ids),  # type: ignore[union-attr]
                   30, "jobs over mutual TLS")
        info = redis.Redis.from_url(url).info("clients")
        assert info["connected_clients"] >= 3  # the supervisor's, its consumer's, ours
    finally:
        server.stop()


def test_a_forked_process_builds_its_own_tls_context(certs: Certs) -> None:
    # redis-py shares one SSLContext per TLS configuration in a process. A fork copies
    # it with the locks OpenSSL holds inside it at that moment: a supervisor thread in a
    # handshake (signing with the client key) left a consumer's own handshake waiting
    # on the key's lock for good, its queue's jobs never claimed. A child builds anew.
    server = tls_server(certs, client_certs="yes")
    try:
        url = (f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={certs.ca}"
               f"&ssl_certfile={certs.client_cert}&ssl_keyfile={certs.client_key}")
        parent = client_from_url(url)
        parent.ping()
        parent_context = id(_tls_context(parent))
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a client of its own, as a forked consumer makes
            try:
                child = client_from_url(url)
                child.ping()
                os.write(writer, b"same" if id(_tls_context(child)) == parent_context
                         else b"own")
            finally:
                os._exit(0)
        os.close(writer)
        try:
            with os.fdopen(reader, "rb") as said:
                assert said.read() == b"own"
        finally:
            os.waitpid(pid, 0)
        parent.close()
    finally:
        server.stop()


def _tls_context(client: redis.Redis) -> ssl.SSLContext:
    conn = client.connection_pool.get_connection()
    try:
        return conn._sock.context  # type: ignore[union-attr]
    finally:
        client.connection_pool.release(conn)


def test_json_logs_name_the_tls_url_without_secrets(
        tls_redis: LocalRedis, certs: Certs, queue_name: str,
        run_supervisor: Callable[..., Proc]) -> None:
    url = _url(tls_redis, certs.ca)
    sup = run_supervisor("start", "--redis-url", url, "--queue", queue_name,
                         "--handler", "sup_jobs:record", "--log-json",
                         env={"ECHOMQ_TEST_LEDGER_URL": url})
    line = sup.wait_for('"event": "start"')
    assert f"rediss://127.0.0.1:{tls_redis.port}" in json.loads(line)["msg"]


def test_a_standalone_consumer_over_tls(tls_redis: LocalRedis, certs: Certs,
                                        queue_name: str) -> None:
    url = _url(tls_redis, certs.ca)
    q = echomq.Queue(queue_name, redis_url=url)
    ids = [q.add("x", {"n": n}) for n in range(5)]
    seen: list[int] = []
    consumer = echomq.Consumer(queue_name, lambda job: seen.append(job.payload["n"]),
                               redis_url=url, beat_ms=100)
    assert consumer.run(burst=True) == 5
    assert sorted(seen) == list(range(5))
    assert all(q.get(i).state == "completed" for i in ids)  # type: ignore[union-attr]


def test_aio_tasks_and_the_cli_over_tls(
        tls_redis: LocalRedis, certs: Certs, queue_name: str,
        run_supervisor: Callable[..., Proc], capsys: pytest.CaptureFixture[str]) -> None:
    """The asyncio producer, tasks (``send`` and ``asend``) and the ``echomq`` CLI reach a
    TLS-only server through the same rediss:// URL."""
    url = _url(tls_redis, certs.ca)
    run_supervisor("start", "--redis-url", url, "--queue", queue_name,
                   "--handler", "sup_jobs:record", "--processes", "1",
                   env={"ECHOMQ_TEST_LEDGER_URL": url})

    @echomq.task(queue=queue_name, name="tls.ping")
    def ping(n: int) -> None:
        """Admitted over TLS; run by the supervisor's handler (it records any name)."""

    async def produce() -> tuple[str, object, str]:
        aq = echomq.aio.Queue(queue_name, redis_url=url)
        try:
            job_id = await aq.add("x", {"n": 1})
            value = await aq.result(job_id, timeout=20)
            sent = await ping.asend(2)
        finally:
            await aq.close()
        return job_id, value, sent

    echomq.configure(redis_url=url)
    try:
        job_id, value, asent = asyncio.run(produce())
        sent = ping.send(3)
    finally:
        echomq.configure(redis_url=None)
    assert value == "ok"
    q = echomq.Queue(queue_name, redis_url=url)
    for task_job in (sent, asent):
        assert q.result(task_job, timeout=20) == "ok"
        assert q.get(task_job).name == "tls.ping"  # type: ignore[union-attr]
    capsys.readouterr()
    assert ops_cli.main(["--redis-url", url, "--json", "show", queue_name, job_id]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == job_id and shown["state"] == "completed"
    assert ops_cli.main(["--redis-url", url, "--json", "stats", queue_name]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 3
