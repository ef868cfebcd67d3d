"""The valkey-ha component's start scripts, run by sh as the pods run them.

What they decide is what matters: which pod replicates which, what the Sentinel
monitors, where the passwords go. So ``valkey-cli`` (the peers' Sentinels) and
``valkey-server`` are stand-ins here: the first answers as the peers' Sentinels
would (or not at all), the second records what it was started with. Three pods
with their DNS names, a real failover and the kubelet cannot run without a cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Rendered

kz = sys.modules["echomq_tests_deploy_k8s_render"]  # loaded by path in conftest.py

VALKEY_CLI = """#!/bin/sh
# a peer's Sentinel: answers with $FAKE_PRIMARY, or is not there
echo "REDISCLI_AUTH=${REDISCLI_AUTH-unset} $*" >> "$RECORD/cli"
[ -n "${FAKE_PRIMARY:-}" ] || exit 1
printf '%s\\n6379\\n' "$FAKE_PRIMARY"
"""
VALKEY_SERVER = """#!/bin/sh
for arg in "$@"; do echo "$arg"; done > "$RECORD/args"
[ -f "$1" ] && cp "$1" "$RECORD/conf"
exit 0
"""


def _containers(overlay_ha: Rendered) -> dict[str, dict]:  # type: ignore[type-arg]
    spec = kz.pod_spec(overlay_ha.one("StatefulSet", "echomq-valkey"))
    return {c["name"]: c for c in spec["containers"]}


def _run(container: dict, tmp_path: Path, pod: str,  # type: ignore[type-arg]
         primary: str | None) -> tuple[list[str], str, str]:
    """Run one container's script; returns (server argv, config file, cli calls)."""
    stubs, record = tmp_path / "bin", tmp_path / "record"
    stubs.mkdir()
    record.mkdir()
    (tmp_path / "sentinel").mkdir()
    for name, text in (("valkey-cli", VALKEY_CLI), ("valkey-server", VALKEY_SERVER)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    (script,) = container["args"]
    script = script.replace("/tmp/", f"{tmp_path}/").replace("/sentinel/", f"{tmp_path}/sentinel/")
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "RECORD": str(record), "POD_NAME": pod,
           "REPLICATION_PASSWORD": "repl-pw", "SENTINEL_PASSWORD": "sent-pw",
           "REDISCLI_AUTH": "probe-pw", "FAKE_PRIMARY": primary or ""}
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    cli = (record / "cli").read_text() if (record / "cli").exists() else ""
    conf = (record / "conf").read_text() if (record / "conf").exists() else ""
    return (record / "args").read_text().splitlines(), conf, cli


def _replicaof(args: list[str]) -> str | None:
    return args[args.index("--replicaof") + 1] if "--replicaof" in args else None


@pytest.mark.parametrize(("pod", "sentinels_say", "replicates"), [
    ("echomq-valkey-0", None, None),  # first start of the set: pod 0 leads
    ("echomq-valkey-1", None, "echomq-valkey-0.echomq-valkey"),
    ("echomq-valkey-2", None, "echomq-valkey-0.echomq-valkey"),
    # after a failover the former primary rejoins as a replica of the new one
    ("echomq-valkey-0", "echomq-valkey-2.echomq-valkey", "echomq-valkey-2.echomq-valkey"),
    ("echomq-valkey-2", "echomq-valkey-2.echomq-valkey", None),
])
def test_valkey_pod_takes_its_role_from_the_sentinels(
        overlay_ha: Rendered, tmp_path: Path, pod: str, sentinels_say: str | None,
        replicates: str | None) -> None:
    args, conf, cli = _run(_containers(overlay_ha)["valkey"], tmp_path, pod, sentinels_say)
    assert _replicaof(args) == replicates
    assert args[args.index("--replica-announce-ip") + 1] == f"{pod}.echomq-valkey"
    assert conf.splitlines() == ["masteruser replication", 'masterauth "repl-pw"']
    assert "repl-pw" not in " ".join(args), "a password on the command line"
    asked = [line for line in cli.splitlines() if "get-master-addr-by-name echomq" in line]
    assert asked and all(line.startswith("REDISCLI_AUTH=unset ") for line in asked)
    assert f"-h {pod}.echomq-valkey " not in cli, "a pod asks its peers, not itself"
    assert oct(os.stat(tmp_path / "replication.conf").st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(("pod", "sentinels_say", "monitors"), [
    ("echomq-valkey-0", None, "echomq-valkey-0.echomq-valkey"),
    ("echomq-valkey-1", "echomq-valkey-2.echomq-valkey", "echomq-valkey-2.echomq-valkey"),
])
def test_sentinel_monitors_the_current_primary(
        overlay_ha: Rendered, tmp_path: Path, pod: str, sentinels_say: str | None,
        monitors: str) -> None:
    args, conf, _cli = _run(_containers(overlay_ha)["sentinel"], tmp_path, pod, sentinels_say)
    assert args == [f"{tmp_path}/sentinel/sentinel.conf", "--sentinel"]
    lines = conf.splitlines()
    assert f"sentinel monitor echomq {monitors} 6379 2" in lines
    assert f"sentinel announce-ip {pod}.echomq-valkey" in lines
    assert "sentinel auth-pass echomq sent-pw" in lines
    assert lines.index("sentinel resolve-hostnames yes") < lines.index(
        f"sentinel monitor echomq {monitors} 6379 2"), "hostnames resolve before monitor"
