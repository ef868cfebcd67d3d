"""What a real cluster needs from deploy/k8s, checked on the rendered objects:
Valkey locked down (NetworkPolicy, ACL users, an authenticated probe) and sized
not to be OOM-killed, autoscaling that fires on kube-prometheus-stack, evictions
that never hang, Secrets the base never overwrites, a Job that re-applies.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from conftest import Rendered

kz = sys.modules["echomq_tests_deploy_k8s_render"]  # loaded by path in conftest.py
REPO = Path(__file__).resolve().parents[2]


def _args(container: dict[str, Any]) -> dict[str, str]:
    args = container["args"]
    return dict(zip(args[1::2], args[2::2], strict=False))


def _mebibytes(quantity: str) -> float:
    units = {"mb": 1, "Mi": 1, "Gi": 1024, "gb": 1024}
    match = re.fullmatch(r"(\d+)([A-Za-z]+)", quantity)
    assert match, quantity
    return int(match.group(1)) * units[match.group(2)]


def _valkey(rendered: Rendered) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    statefulset = rendered.one("StatefulSet", "echomq-valkey")
    spec = kz.pod_spec(statefulset)
    (container,) = spec["containers"]
    return statefulset, spec, container


def acl_users(text: str) -> dict[str, list[str]]:
    """users.acl -> {user: [rules]}."""
    users = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "user":
            users[words[1]] = words[2:]
    return users


# ------------------------------------------------------------ 1. locked down


def test_networkpolicy_admits_only_supervisors_and_labelled_producers(
        rendered: Rendered) -> None:
    statefulset, _spec, container = _valkey(rendered)
    policy = rendered.one("NetworkPolicy", "echomq-valkey")["spec"]
    valkey_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= valkey_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    peers = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    for peer in rule["from"]:
        assert set(peer) == {"podSelector"}, "no namespace-wide or ipBlock peer"
    supervisor = rendered.supervisor()["spec"]["template"]["metadata"]["labels"]
    assert any(peer.items() <= supervisor.items() for peer in peers)
    assert {"echomq.dev/valkey-client": "true"} in peers
    for peer in peers:
        assert peer, "an empty podSelector admits every pod of the namespace"
    (port,) = rule["ports"]
    assert port["port"] in ("valkey", 6379)
    # the migration Job's pods talk to the floor only
    job = rendered.one("Job", "echomq-floor-migrate")["spec"]["template"]["metadata"]["labels"]
    assert not any(peer.items() <= job.items() for peer in peers)


def test_valkey_requires_acl_users_from_the_secret(rendered: Rendered) -> None:
    _statefulset, spec, container = _valkey(rendered)
    args = _args(container)
    assert args.get("--protected-mode", "yes") == "yes"
    assert "--requirepass" not in container["args"], "a password in the command line"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    acl_file = args["--aclfile"]
    (volume_name,) = [n for n, path in mounts.items() if acl_file.startswith(path + "/")]
    secret = volumes[volume_name]["secret"]
    assert secret["secretName"] == "echomq-valkey-acl"
    assert {item["path"]: item["key"] for item in secret["items"]} == {"users.acl": "users.acl"}
    assert secret["defaultMode"] & 0o007 == 0, "the ACL file is not world-readable"


def test_readiness_probe_authenticates_without_showing_the_password(
        rendered: Rendered) -> None:
    _statefulset, _spec, container = _valkey(rendered)
    command = " ".join(container["readinessProbe"]["exec"]["command"])
    assert "--user probe" in command and "ping" in command and "PONG" in command
    assert " -a " not in command and "--pass" not in command
    env = {item["name"]: item for item in container["env"]}
    ref = env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "echomq-valkey-acl", "key": "probe-password"}


def test_example_acl_has_no_default_user_and_least_privilege_roles(overlay: Rendered) -> None:
    secret = overlay.one("Secret", "echomq-valkey-acl")["stringData"]
    users = acl_users(secret["users.acl"])
    assert set(users) == {"default", "probe", "supervisor", "producer", "operator"}
    assert "off" in users["default"] and "nopass" not in users["default"]
    assert users["probe"] == ["on", f">{secret['probe-password']}", "resetchannels", "-@all",
                              "+ping"]
    for role in ("supervisor", "producer", "operator"):
        rules = users[role]
        assert "~emq:*" in rules and "-@all" in rules and "-@dangerous" in rules, role
        assert not [r for r in rules if r.startswith("~") and r != "~emq:*"], role
        assert "+@all" not in rules and "allkeys" not in rules, role


def test_urls_use_the_acl_users_passwords(overlay: Rendered) -> None:
    users = acl_users(overlay.one("Secret", "echomq-valkey-acl")["stringData"]["users.acl"])
    url = urlsplit(overlay.one("Secret", "echomq-urls")["stringData"]["ECHOMQ_REDIS_URL"])
    assert url.username == "supervisor"
    assert f">{url.password}" in users["supervisor"]


# ----------------------------------------------------------- 2. memory and HA


def test_valkey_memory_leaves_room_for_a_rewrite_fork(rendered: Rendered) -> None:
    _statefulset, _spec, container = _valkey(rendered)
    args = _args(container)
    assert args["--save"] == "", "RDB snapshots fork on top of AOF rewrites"
    resources = container["resources"]
    assert resources["requests"] == resources["limits"], "Guaranteed QoS: requests = limits"
    share = _mebibytes(args["--maxmemory"]) / _mebibytes(resources["limits"]["memory"])
    assert 0.55 <= share <= 0.60, share


def test_single_valkey_risk_is_said_in_bold() -> None:
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    assert re.search(r"\*\*[^*]*single point of failure[^*]*\*\*", readme, re.IGNORECASE)


# ------------------------------------------------------------ 5. autoscaling


def test_servicemonitor_carries_the_release_label(overlay: Rendered) -> None:
    monitor = overlay.one("ServiceMonitor", "echomq-supervisor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_autoscaler_query_is_scoped_and_no_data_is_not_zero(overlay: Rendered) -> None:
    scaled = overlay.one("ScaledObject", "echomq-supervisor")
    (trigger,) = scaled["spec"]["triggers"]
    namespace = overlay.supervisor()["metadata"]["namespace"]
    assert f'namespace="{namespace}"' in trigger["metadata"]["query"]
    assert trigger["metadata"].get("ignoreNullValues", "true") == "false"
    assert "replicas" not in overlay.supervisor()["spec"]


def test_base_deployment_leaves_replicas_to_the_autoscaler(base: Rendered) -> None:
    assert "replicas" not in base.supervisor()["spec"]


# --------------------------------------------------- 6, 7, 9. objects and probes


def test_pdb_never_blocks_a_drain_while_pods_are_unready(rendered: Rendered) -> None:
    spec = rendered.one("PodDisruptionBudget", "echomq-supervisor")["spec"]
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_migration_job_is_cleaned_up_so_the_next_apply_recreates_it(
        rendered: Rendered) -> None:
    job = rendered.one("Job", "echomq-floor-migrate")["spec"]
    assert 0 < job["ttlSecondsAfterFinished"] <= 3600


def test_migration_job_logs_like_the_supervisor(rendered: Rendered) -> None:
    job = rendered.one("Job", "echomq-floor-migrate")
    (container,) = kz.pod_spec(job)["containers"]
    env = rendered.effective_env(container)
    supervisor_env = rendered.effective_env(rendered.supervisor_container())
    for name in ("ECHOMQ_LOG_JSON", "ECHOMQ_LOG_LEVEL"):
        assert env[name] == supervisor_env[name], name


def test_startup_probe_waits_for_readiness(rendered: Rendered) -> None:
    container = rendered.supervisor_container()
    startup = container["startupProbe"]["httpGet"]
    assert startup["path"] == container["readinessProbe"]["httpGet"]["path"] == "/readyz"


# ------------------------------------------------------- 2. highly available


def _script(container: dict[str, Any]) -> str:
    assert container["command"] == ["sh", "-c"]
    (script,) = container["args"]
    return str(script)


def test_ha_runs_three_valkeys_one_per_node_with_sentinels(overlay_ha: Rendered) -> None:
    statefulset, spec, _container = _valkey_and_sentinel(overlay_ha)[:3]
    assert statefulset["spec"]["replicas"] == 3
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = overlay_ha.one("PodDisruptionBudget", "echomq-valkey")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["minAvailable"] == 2, "one pod at a time: a primary and a replica always remain"


def _valkey_and_sentinel(rendered: Rendered) -> tuple[Any, ...]:
    statefulset = rendered.one("StatefulSet", "echomq-valkey")
    spec = kz.pod_spec(statefulset)
    containers = {c["name"]: c for c in spec["containers"]}
    return statefulset, spec, containers["valkey"], containers["sentinel"]


def test_ha_valkey_keeps_every_setting_of_the_base(overlay: Rendered,
                                                   overlay_ha: Rendered) -> None:
    _s, _spec, base_valkey = _valkey(overlay)
    _s, _spec, valkey, _sentinel = _valkey_and_sentinel(overlay_ha)
    script = _script(valkey)
    for flag, value in _args(base_valkey).items():
        shown = '""' if value == "" else value
        assert f"{flag} {shown}" in script, (flag, value)
    assert "--replicaof" in script and "masterauth" in script
    assert "$REPLICATION_PASSWORD" in script and "--masterauth" not in script, \
        "the replication password must not be on the command line"
    assert valkey["resources"] == base_valkey["resources"]


def test_ha_scripts_are_valid_shell(overlay_ha: Rendered) -> None:
    import subprocess

    _s, _spec, valkey, sentinel = _valkey_and_sentinel(overlay_ha)
    for container in (valkey, sentinel):
        done = subprocess.run(["sh", "-n", "-c", _script(container)], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, (container["name"], done.stderr)


def test_ha_sentinels_watch_with_a_quorum_of_two_and_their_own_user(
        overlay_ha: Rendered) -> None:
    _s, _spec, _valkey_c, sentinel = _valkey_and_sentinel(overlay_ha)
    script = _script(sentinel)
    assert re.search(r"sentinel monitor echomq \$primary 6379 2\b", script)
    assert "sentinel auth-user echomq sentinel" in script
    env = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in sentinel["env"]
           if "secretKeyRef" in item.get("valueFrom", {})}
    assert env["SENTINEL_PASSWORD"] == {"name": "echomq-valkey-acl", "key": "sentinel-password"}
    ports = {p["name"]: p["containerPort"] for p in sentinel["ports"]}
    assert ports == {"sentinel": 26379}


def test_ha_clients_reach_the_sentinels(overlay_ha: Rendered) -> None:
    url = overlay_ha.one("Secret", "echomq-urls")["stringData"]["ECHOMQ_REDIS_URL"]
    parts = urlsplit(url)
    assert parts.scheme == "redis+sentinel" and parts.path == "/echomq/0"
    hosts = parts.netloc.rpartition("@")[2].split(",")
    assert hosts == [f"echomq-valkey-{i}.echomq-valkey:26379" for i in range(3)]
    service = overlay_ha.one("Service", "echomq-valkey")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "valkey": 6379, "sentinel": 26379}
    (rule,) = overlay_ha.one("NetworkPolicy", "echomq-valkey")["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {"valkey", "sentinel"}
    peers = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    valkey_labels = overlay_ha.one("StatefulSet", "echomq-valkey")["spec"]["template"][
        "metadata"]["labels"]
    assert any(peer.items() <= valkey_labels.items() for peer in peers), "replication"


def test_ha_acl_adds_replication_and_sentinel_users(overlay: Rendered,
                                                   overlay_ha: Rendered) -> None:
    secret = overlay_ha.one("Secret", "echomq-valkey-acl")["stringData"]
    users = acl_users(secret["users.acl"])
    assert f">{secret['replication-password']}" in users["replication"]
    assert f">{secret['sentinel-password']}" in users["sentinel"]
    assert "+psync" in users["replication"] and "~emq:*" not in users["replication"]
    single = acl_users(overlay.one("Secret", "echomq-valkey-acl")["stringData"]["users.acl"])
    assert {role: users[role] for role in single} == single, "the roles' rules drifted apart"


@pytest.mark.parametrize("version", ["1.27.0"])
def test_ha_objects_validate(overlay_ha: Rendered, version: str) -> None:
    import kubernetes_validate

    for doc in overlay_ha.docs:
        if doc["apiVersion"].startswith(("keda.sh", "monitoring.coreos.com")):
            continue
        kubernetes_validate.validate(doc, version, strict=True)
