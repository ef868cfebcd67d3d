"""The Kubernetes manifests of deploy/k8s: schemas, rendering, and the facts
the supervisor relies on (env names, drain vs grace period, health port,
security context). Offline: kubernetes-validate ships the schemas.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kubernetes_validate
import pytest

if TYPE_CHECKING:
    from conftest import Rendered

HERE = Path(__file__).resolve().parent
K8S = HERE.parents[1] / "deploy" / "k8s"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"


# k8s_render.py, loaded by path in conftest.py (which pytest always imports first)
kz = sys.modules["echomq_tests_deploy_k8s_render"]

# Oldest Kubernetes we claim to support, and the newest the package knows.
K8S_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]

# CRD kinds: no schema in kubernetes-validate, so they are checked structurally.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}
CORE_GROUPS = {"", "apps", "batch", "policy", "networking.k8s.io", "rbac.authorization.k8s.io"}

REQUIRED_ENV = {
    "ECHOMQ_REDIS_URL",
    "ECHOMQ_QUEUE",
    "ECHOMQ_HANDLER",
    "ECHOMQ_HEALTH_PORT",
    "ECHOMQ_DRAIN_TIMEOUT",
}


# ------------------------------------------------------------------ helpers


def _group(doc: dict[str, Any]) -> str:
    api_version = doc["apiVersion"]
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def _check_crd_structure(doc: dict[str, Any]) -> None:
    assert (doc.get("apiVersion"), doc.get("kind")) in CRD_KINDS, doc.get("kind")
    assert isinstance(doc.get("metadata"), dict) and doc["metadata"].get("name")
    assert isinstance(doc.get("spec"), dict) and doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        spec = doc["spec"]
        assert isinstance(spec["selector"].get("matchLabels"), dict)
        assert spec["endpoints"], "a ServiceMonitor without endpoints scrapes nothing"
        for endpoint in spec["endpoints"]:
            assert isinstance(endpoint.get("port"), str), "endpoints[].port is a port *name*"
    if doc["kind"] == "ScaledObject":
        spec = doc["spec"]
        assert spec["scaleTargetRef"]["name"]
        assert spec["triggers"]
        for trigger in spec["triggers"]:
            assert trigger["type"]
            # KEDA trigger metadata is map[string]string: a bare number fails to apply.
            for key, value in trigger["metadata"].items():
                assert isinstance(value, str), f"trigger metadata {key} must be a string"


def validate(doc: dict[str, Any], version: str) -> None:
    if (doc.get("apiVersion"), doc.get("kind")) in CRD_KINDS:
        _check_crd_structure(doc)
        return
    problem = None
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = "/".join(str(part) for part in error.path)
        problem = f"{doc['kind']}/{doc['metadata']['name']}: {where}: {error.message}"
    if problem:  # outside `except`: the schema error's repr is pages long
        pytest.fail(problem, pytrace=False)


def resource_files() -> list[Path]:
    """Every manifest file listed under `resources` of a kustomization in deploy/k8s."""
    files: list[Path] = []
    for kustomization in sorted(K8S.rglob("kustomization.yaml")):
        (spec,) = kz.load_yaml_docs(kustomization)
        for entry in spec.get("resources", []):
            path = (kustomization.parent / entry).resolve()
            if path.is_file():
                files.append(path)
    return files


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def pod_labels(doc: dict[str, Any]) -> dict[str, str]:
    return dict(doc["spec"]["template"]["metadata"].get("labels", {}))


def resolve_port(port: int | str, container: dict[str, Any]) -> int:
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    named = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert len(named) == 1, f"port name {port!r} not declared by container {container['name']}"
    return int(named[0])


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024**2, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(quantity))
    assert match, quantity
    number, unit = match.groups()
    return float(number) * units[unit] if unit else float(number) / 2**20


# ------------------------------------------------------- schemas and render


def test_resource_files_exist() -> None:
    names = {path.name for path in resource_files()}
    assert {
        "deployment.yaml",
        "configmap.yaml",
        "secrets.yaml",
        "valkey-networkpolicy.yaml",
        "pdb.yaml",
        "migrate-job.yaml",
        "metrics-service.yaml",
        "valkey-service.yaml",
        "valkey-statefulset.yaml",
        "servicemonitor.yaml",
        "scaledobject.yaml",
    } <= names


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", resource_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_each_manifest_file_validates(path: Path, version: str) -> None:
    for doc in kz.load_yaml_docs(path):
        validate(doc, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_manifests_validate(rendered: Rendered, version: str) -> None:
    assert rendered.docs
    for doc in rendered.docs:
        validate(doc, version)


def test_base_has_only_core_kinds(base: Rendered) -> None:
    for doc in base.docs:
        assert _group(doc) in CORE_GROUPS, (
            f"{doc['kind']} ({doc['apiVersion']}) belongs in a component"
        )


def test_base_contents(base: Rendered) -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in base.docs}
    assert kinds == {
        ("ConfigMap", "echomq-config"),
        ("Job", "echomq-floor-migrate"),
        ("Deployment", "echomq-supervisor"),
        ("PodDisruptionBudget", "echomq-supervisor"),
        ("Service", "echomq-supervisor-metrics"),
        ("Service", "echomq-valkey"),
        ("StatefulSet", "echomq-valkey"),
        ("NetworkPolicy", "echomq-valkey"),
    }


def test_overlay_customises_the_base(overlay: Rendered) -> None:
    namespace = overlay.one("Namespace", "echomq")
    assert "namespace" not in namespace["metadata"]
    for doc in overlay.docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "echomq", doc["kind"]
    for _doc, _spec, container in overlay.echomq_containers():
        assert container["image"] == "registry.example.com/echomq:0.1.0"
    assert {(d["kind"], d["metadata"]["name"]) for d in overlay.of_kind("Secret")} == {
        ("Secret", "echomq-urls"), ("Secret", "echomq-valkey-acl")}
    config = overlay.config_data("echomq-config")
    assert config["ECHOMQ_QUEUE"] == "emails"
    assert config["ECHOMQ_HANDLER"] == "app.emails:send"
    assert overlay.one("ScaledObject", "echomq-supervisor")
    assert overlay.one("ServiceMonitor", "echomq-supervisor")
    # the migration Job runs the same image as the supervisors it prepares
    jobs = [c["image"] for d, _s, c in overlay.echomq_containers() if d["kind"] == "Job"]
    assert jobs == ["registry.example.com/echomq:0.1.0"]


def test_renderer_is_a_real_kustomize_v5() -> None:
    """The checks render with the pinned kubectl's kustomize, never a stand-in."""
    command = kz.renderer()
    version = subprocess.run([command[0], "version", "--client"], capture_output=True,
                             text=True, timeout=60, check=False).stdout
    if command[1] == "kustomize":  # kubectl: "Kustomize Version: v5.x"
        match = re.search(r"Kustomize Version: v(\d+)\.", version)
    else:
        match = re.search(r"v(\d+)\.", version)
    assert match and int(match.group(1)) >= 5, version


def test_renderer_refuses_a_broken_kustomization(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - missing.yaml\n")
    with pytest.raises(kz.RenderError, match="missing.yaml"):
        kz.render(tmp_path)


# ----------------------------------------------------------- env contract


def test_env_names_are_supervisor_settings(rendered: Rendered, env_vars: dict[str, str]) -> None:
    known = set(env_vars.values())
    names: set[str] = set()
    for _doc, _spec, container in rendered.echomq_containers():
        names |= {item["name"] for item in container.get("env", [])}
        names |= set(rendered.effective_env(container))
    for config_map in rendered.of_kind("ConfigMap"):
        names |= set(config_map.get("data", {}))
    for secret in rendered.of_kind("Secret"):
        if secret["metadata"]["name"] == "echomq-urls":
            names |= set(secret.get("data", {})) | set(secret.get("stringData", {}))
    assert names <= known, f"not in supervisor.settings.ENV_VARS: {sorted(names - known)}"
    assert names >= REQUIRED_ENV, f"missing: {sorted(REQUIRED_ENV - names)}"


def test_supervisor_gets_every_required_setting(rendered: Rendered) -> None:
    env = rendered.effective_env(rendered.supervisor_container())
    assert set(env) >= REQUIRED_ENV, sorted(REQUIRED_ENV - set(env))
    for name in ("ECHOMQ_QUEUE", "ECHOMQ_HANDLER", "ECHOMQ_HEALTH_PORT", "ECHOMQ_DRAIN_TIMEOUT"):
        assert env[name], f"{name} is empty"
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", str(env["ECHOMQ_QUEUE"]))
    assert re.fullmatch(r"[\w.]+:[\w.]+", str(env["ECHOMQ_HANDLER"])), "MODULE:CALLABLE"


def test_secrets_hold_the_urls_and_configmaps_do_not(rendered: Rendered) -> None:
    env_items = rendered.supervisor_container()["env"]
    from_secret = {
        item["name"] for item in env_items if "secretKeyRef" in item.get("valueFrom", {})
    }
    assert {"ECHOMQ_REDIS_URL", "ECHOMQ_FLOOR_URL"} <= from_secret
    for config_map in rendered.of_kind("ConfigMap"):
        assert not {"ECHOMQ_REDIS_URL", "ECHOMQ_FLOOR_URL"} & set(config_map.get("data", {}))


def test_base_ships_no_secret(base: Rendered) -> None:
    """Applying the base never overwrites a Secret managed out of band."""
    assert base.of_kind("Secret") == []
    assert not list(BASE.glob("*secret*")), "a Secret file in the base"


def _secret_refs(rendered: Rendered) -> set[str]:
    names: set[str] = set()
    for _doc, spec in rendered.workloads():
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    names.add(source["secretRef"]["name"])
            for item in container.get("env", []):
                if "secretKeyRef" in item.get("valueFrom", {}):
                    names.add(item["valueFrom"]["secretKeyRef"]["name"])
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                names.add(volume["secret"]["secretName"])
    return names


def test_base_names_the_secrets_it_needs(base: Rendered) -> None:
    assert _secret_refs(base) == {"echomq-urls", "echomq-valkey-acl"}
    readme = (K8S.parent / "README.md").read_text(encoding="utf-8")
    for name in ("echomq-urls", "echomq-valkey-acl", "users.acl", "probe-password"):
        assert name in readme, f"deploy/README.md does not explain {name}"


def test_every_reference_resolves(overlay: Rendered) -> None:
    rendered = overlay
    assert {"ECHOMQ_REDIS_URL", "ECHOMQ_FLOOR_URL"} <= rendered.secret_keys("echomq-urls")
    for _doc, spec in rendered.workloads():
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                keys = rendered.secret_keys(volume["secret"]["secretName"])
                assert {item["key"] for item in volume["secret"].get("items", [])} <= keys
    for doc, _spec, container in rendered.containers():
        for source in container.get("envFrom", []):
            for ref_kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if field in source and not source[field].get("optional"):
                    rendered.one(ref_kind, source[field]["name"])
        for item in container.get("env", []):
            value_from = item.get("valueFrom", {})
            if "secretKeyRef" in value_from:
                ref = value_from["secretKeyRef"]
                assert ref["key"] in rendered.secret_keys(ref["name"]), (doc["kind"], ref)
            if "configMapKeyRef" in value_from:
                ref = value_from["configMapKeyRef"]
                assert ref["key"] in rendered.config_data(ref["name"]), (doc["kind"], ref)


def test_redis_url_points_at_the_valkey_statefulset(overlay: Rendered) -> None:
    rendered = overlay
    secret = rendered.one("Secret", "echomq-urls")
    url = secret["stringData"]["ECHOMQ_REDIS_URL"]
    host = re.match(r"redis://(?:[^@/]*@)?([^:/]+)", url)
    assert host, url
    statefulset = rendered.one("StatefulSet", "echomq-valkey")
    service = statefulset["spec"]["serviceName"]
    assert host.group(1) == f"{statefulset['metadata']['name']}-0.{service}"


def test_memory_limit_covers_every_recycled_child(rendered: Rendered) -> None:
    env = rendered.effective_env(rendered.supervisor_container())
    limit = mebibytes(rendered.supervisor_container()["resources"]["limits"]["memory"])
    children = int(str(env["ECHOMQ_PROCESSES"])) * int(str(env["ECHOMQ_MAX_MEMORY_MB"]))
    # room for the supervisor process itself
    assert children + 128 <= limit, (children, limit)


def test_service_links_cannot_shadow_settings(rendered: Rendered, env_vars: dict[str, str]) -> None:
    """Kubernetes injects <SERVICE>_PORT & co. for every Service in the namespace."""
    injected: set[str] = set()
    for service in rendered.of_kind("Service"):
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        injected |= {f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT", f"{prefix}_PORT"}
        for port in service["spec"].get("ports", []):
            proto = port.get("protocol", "TCP")
            base = f"{prefix}_PORT_{port['port']}_{proto}"
            injected |= {base, f"{base}_PROTO", f"{base}_PORT", f"{base}_ADDR"}
            if "name" in port:
                injected.add(f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}")
    assert not injected & set(env_vars.values())
    for _doc, spec in rendered.workloads():
        assert spec.get("enableServiceLinks") is False


# -------------------------------------------------- drain, probes, ports


def test_grace_period_outlasts_the_drain(rendered: Rendered) -> None:
    spec = kz.pod_spec(rendered.supervisor())
    env = rendered.effective_env(rendered.supervisor_container())
    drain = float(str(env["ECHOMQ_DRAIN_TIMEOUT"]))
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > drain
    # after the drain: SIGKILL the children, requeue their jobs, exit
    assert grace - drain >= 5, (grace, drain)


def test_no_prestop_hook_eats_the_drain(rendered: Rendered) -> None:
    for _doc, _spec, container in rendered.echomq_containers():
        assert "preStop" not in container.get("lifecycle", {})


def test_entrypoint_is_not_overridden(rendered: Rendered) -> None:
    container = rendered.supervisor_container()
    assert "command" not in container, "the image ENTRYPOINT must stay PID 1"
    assert container["args"][0] == "start"
    (job,) = rendered.of_kind("Job")
    (migrate,) = kz.pod_spec(job)["containers"]
    assert "command" not in migrate
    assert migrate["args"] == ["migrate"]


def test_probes_use_the_health_port(rendered: Rendered) -> None:
    container = rendered.supervisor_container()
    port = int(str(rendered.effective_env(container)["ECHOMQ_HEALTH_PORT"]))
    paths = {}
    for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container.get(probe_name)
        if probe is None:
            assert probe_name == "startupProbe", f"{probe_name} missing"
            continue
        assert resolve_port(probe["httpGet"]["port"], container) == port, probe_name
        paths[probe_name] = probe["httpGet"]["path"]
    assert paths["livenessProbe"] == "/livez"
    assert paths["readinessProbe"] == "/readyz"
    assert port in {p["containerPort"] for p in container["ports"]}


def test_metrics_service_scrapes_the_health_port(rendered: Rendered) -> None:
    container = rendered.supervisor_container()
    port = int(str(rendered.effective_env(container)["ECHOMQ_HEALTH_PORT"]))
    service = rendered.one("Service", "echomq-supervisor-metrics")
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    (service_port,) = service["spec"]["ports"]
    assert int(annotations["prometheus.io/port"]) == service_port["port"]
    assert resolve_port(service_port["targetPort"], container) == port


def test_resources_are_bounded(rendered: Rendered) -> None:
    for doc, _spec in rendered.workloads():
        for container in kz.pod_spec(doc)["containers"]:
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), container["name"]
            assert "memory" in resources.get("limits", {}), container["name"]


# ---------------------------------------------------------------- security


def _effective_security(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    pod = spec.get("securityContext", {})
    own = container.get("securityContext", {})
    merged = {
        key: own.get(key, pod.get(key))
        for key in ("runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile")
    }
    for key in ("readOnlyRootFilesystem", "allowPrivilegeEscalation", "capabilities", "privileged"):
        merged[key] = own.get(key)
    return merged


def test_pods_meet_the_restricted_profile(rendered: Rendered) -> None:
    for doc, spec in rendered.workloads():
        assert spec.get("automountServiceAccountToken") is False, doc["kind"]
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(flag), (doc["kind"], flag)
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume, (doc["kind"], volume["name"])
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            security = _effective_security(spec, container)
            where = f"{doc['kind']}/{doc['metadata']['name']}:{container['name']}"
            assert security["runAsNonRoot"] is True, where
            assert isinstance(security["runAsUser"], int) and security["runAsUser"] > 0, where
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["allowPrivilegeEscalation"] is False, where
            assert not security["privileged"], where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
            assert security["seccompProfile"] == {"type": "RuntimeDefault"}, where


def test_echomq_pods_run_as_10001_with_a_writable_tmp(rendered: Rendered) -> None:
    containers = list(rendered.echomq_containers())
    assert {doc["kind"] for doc, _s, _c in containers} == {"Deployment", "Job"}
    for doc, spec, container in containers:
        security = _effective_security(spec, container)
        assert security["runAsUser"] == 10001, doc["kind"]
        assert container["securityContext"]["runAsUser"] == 10001
        assert container["securityContext"]["runAsNonRoot"] is True
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, doc["kind"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        assert "emptyDir" in volumes[mounts["/tmp"]], doc["kind"]


# ------------------------------------------------- selectors and objects


def test_selectors_pick_the_right_pods(rendered: Rendered) -> None:
    deployment = rendered.supervisor()
    supervisor_labels = pod_labels(deployment)
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selects(selector, supervisor_labels)
    other_pods = [pod_labels(doc) for doc, _ in rendered.workloads() if doc is not deployment]
    # neither the Deployment, the PDB nor the metrics Service may catch the
    # migration Job's or Valkey's pods
    pdb = rendered.one("PodDisruptionBudget", "echomq-supervisor")
    metrics = rendered.one("Service", "echomq-supervisor-metrics")
    for chooser in (
        selector,
        pdb["spec"]["selector"]["matchLabels"],
        metrics["spec"]["selector"],
    ):
        assert selects(chooser, supervisor_labels)
        assert not any(selects(chooser, labels) for labels in other_pods)


def test_pdb_allows_one_pod_down(rendered: Rendered) -> None:
    spec = rendered.one("PodDisruptionBudget", "echomq-supervisor")["spec"]
    assert spec == {**spec, "maxUnavailable": 1}
    assert rendered.supervisor()["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_valkey_persists_with_aof(rendered: Rendered) -> None:
    statefulset = rendered.one("StatefulSet", "echomq-valkey")
    service = rendered.one("Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "the StatefulSet's Service must be headless"
    assert selects(service["spec"]["selector"], pod_labels(statefulset))
    (container,) = kz.pod_spec(statefulset)["containers"]
    args = container["args"]
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "valkey-server"
    assert pairs["--appendonly"] == "yes"
    assert pairs["--maxmemory-policy"] == "noeviction", "a queue must never evict jobs"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == pairs["--dir"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert mebibytes(pairs["--maxmemory"].replace("mb", "Mi")) < mebibytes(
        container["resources"]["limits"]["memory"]
    )


def test_migration_job_runs_first(overlay: Rendered) -> None:
    rendered = overlay
    job = rendered.one("Job", "echomq-floor-migrate")
    assert kz.pod_spec(job)["restartPolicy"] in {"Never", "OnFailure"}
    annotations = job["metadata"]["annotations"]
    wave = int(annotations["argocd.argoproj.io/sync-wave"])
    assert annotations["argocd.argoproj.io/hook"] == "Sync"
    assert wave < 0, "before the Deployment (wave 0)"
    assert "argocd.argoproj.io/sync-wave" not in rendered.supervisor()["metadata"].get(
        "annotations", {}
    )
    # what the Job needs must exist earlier, and carry the pre-rollout label the
    # README's `kubectl apply -l echomq.dev/stage=pre-rollout` step selects
    (migrate,) = kz.pod_spec(job)["containers"]
    assert job["metadata"]["labels"]["echomq.dev/stage"] == "pre-rollout"
    for item in migrate["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef") or item.get("valueFrom", {}).get(
            "configMapKeyRef"
        )
        if ref is None or ref.get("optional"):
            continue
        kind = "Secret" if "secretKeyRef" in item["valueFrom"] else "ConfigMap"
        needed = rendered.one(kind, ref["name"])
        assert needed["metadata"]["labels"]["echomq.dev/stage"] == "pre-rollout"
        assert int(needed["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) < wave
    assert "ECHOMQ_FLOOR_URL" in {item["name"] for item in migrate["env"]}


def test_overlay_namespace_is_applied_before_the_job(overlay: Rendered) -> None:
    namespace = overlay.one("Namespace", "echomq")
    assert namespace["metadata"]["labels"]["echomq.dev/stage"] == "pre-rollout"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# ---------------------------------------------------------- CRD examples


def test_servicemonitor_scrapes_the_metrics_service(overlay: Rendered) -> None:
    monitor = overlay.one("ServiceMonitor", "echomq-supervisor")
    service = overlay.one("Service", "echomq-supervisor-metrics")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    port_names = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"


def test_scaledobject_scales_on_waiting_jobs(overlay: Rendered) -> None:
    scaled = overlay.one("ScaledObject", "echomq-supervisor")
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert target["name"] == overlay.supervisor()["metadata"]["name"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    queue = overlay.config_data("echomq-config")["ECHOMQ_QUEUE"]
    assert "echomq_queue_jobs{" in query
    assert 'state="waiting"' in query
    assert f'queue="{queue}"' in query
    # every pod exports the same queue-wide gauge: sum() would count it N times
    assert query.startswith("max(")
    assert float(trigger["metadata"]["threshold"]) > 0
    # the metric comes from the scaled pods themselves: never scale to zero
    assert spec["minReplicaCount"] >= 1
    assert spec["maxReplicaCount"] >= spec["minReplicaCount"]
    # the count belongs to KEDA alone: no replicas field for every sync to re-apply
    assert "replicas" not in overlay.supervisor()["spec"]
