"""A small kustomize renderer for the subset of features deploy/k8s uses.

CI machines need not have ``kubectl``; this renders the base and the overlay
in Python so the manifest checks always run. Where ``kubectl kustomize`` is
available, a test renders with both and requires the same objects, so this
module cannot drift from real kustomize unnoticed.

Supported, and nothing else (an unknown field is an error, not a silent
no-op): ``resources`` (files and directories), ``components``, ``namespace``,
``images`` (newName/newTag/digest), ``replicas``, and ``patches`` given by
``path`` as strategic-merge patches whose target is the patch's own
kind/name. The strategic merge knows what these manifests need: maps merge,
``null`` deletes a key, lists of maps that all carry ``name`` merge by name,
other lists are replaced.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "images",
    "replicas",
    "patches",
}
# Kinds that take no namespace (the ones a namespace transformer must skip).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "APIService",
}
REPLICATED = {"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"}


class KustomizeError(Exception):
    """A kustomization this renderer cannot (or must not) render."""


def load_yaml_docs(path: Path) -> list[Doc]:
    """All non-empty YAML documents of one file."""
    with path.open(encoding="utf-8") as handle:
        docs = [doc for doc in yaml.safe_load_all(handle) if doc is not None]
    for doc in docs:
        if not isinstance(doc, dict):
            raise KustomizeError(f"{path}: a document is not a mapping")
    return docs


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise KustomizeError(f"{directory}: no kustomization file")


def render(directory: Path | str) -> list[Doc]:
    """Render the kustomization in ``directory`` into a list of objects."""
    directory = Path(directory).resolve()
    kustomization = _read_kustomization(directory, expected_kind="Kustomization")
    docs = _accumulate(directory, kustomization)
    for component in kustomization.get("components", []):
        component_dir = (directory / component).resolve()
        spec = _read_kustomization(component_dir, expected_kind="Component")
        docs.extend(_accumulate(component_dir, spec))
        docs = _transform(component_dir, spec, docs)
    docs = _transform(directory, kustomization, docs)
    _check_unique(docs, directory)
    return docs


def _read_kustomization(directory: Path, expected_kind: str) -> Doc:
    path = kustomization_file(directory)
    (spec,) = load_yaml_docs(path)
    kind = spec.get("kind", "Kustomization")
    if kind != expected_kind:
        raise KustomizeError(f"{path}: kind {kind}, expected {expected_kind}")
    unknown = set(spec) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: unsupported fields {sorted(unknown)}")
    if expected_kind == "Component" and "components" in spec:
        raise KustomizeError(f"{path}: nested components are not supported")
    return spec


def _accumulate(directory: Path, spec: Doc) -> list[Doc]:
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            docs.extend(render(target))
        elif target.is_file():
            docs.extend(load_yaml_docs(target))
        else:
            raise KustomizeError(f"{directory}: resource {entry!r} not found")
    return docs


def _transform(directory: Path, spec: Doc, docs: list[Doc]) -> list[Doc]:
    docs = copy.deepcopy(docs)
    for patch_entry in spec.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise KustomizeError(f"{directory}: only `patches: - path:` is supported")
        for patch in load_yaml_docs(directory / patch_entry["path"]):
            _apply_patch(docs, patch, directory)
    namespace = spec.get("namespace")
    if namespace:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc.setdefault("metadata", {})["namespace"] = namespace
    for entry in spec.get("replicas", []):
        matched = [d for d in docs if d["kind"] in REPLICATED and _name(d) == entry["name"]]
        if not matched:
            raise KustomizeError(f"{directory}: replicas target {entry['name']!r} not found")
        for doc in matched:
            doc.setdefault("spec", {})["replicas"] = int(entry["count"])
    for entry in spec.get("images", []):
        for doc in docs:
            for container in _containers(doc):
                container["image"] = _retag(container.get("image", ""), entry)
    return docs


def _name(doc: Doc) -> str:
    return str(doc.get("metadata", {}).get("name", ""))


def _apply_patch(docs: list[Doc], patch: Doc, directory: Path) -> None:
    targets = [
        doc
        for doc in docs
        if doc.get("kind") == patch.get("kind")
        and _name(doc) == _name(patch)
        and _group(doc) == _group(patch)
    ]
    if len(targets) != 1:
        raise KustomizeError(
            f"{directory}: patch {patch.get('kind')}/{_name(patch)} matches {len(targets)} objects"
        )
    merged = strategic_merge(targets[0], patch)
    targets[0].clear()
    targets[0].update(merged)


def _group(doc: Doc) -> str:
    api_version = str(doc.get("apiVersion", ""))
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def strategic_merge(base: Any, patch: Any) -> Any:
    """Merge ``patch`` into ``base`` (a copy) the way these manifests need."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and _named_list(base, patch):
        merged_list = copy.deepcopy(base)
        index = {item["name"]: position for position, item in enumerate(merged_list)}
        for item in patch:
            if item["name"] in index:
                position = index[item["name"]]
                merged_list[position] = strategic_merge(merged_list[position], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def _named_list(*lists: list[Any]) -> bool:
    return all(isinstance(item, dict) and "name" in item for items in lists for item in items)


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


def _containers(doc: Doc) -> list[Doc]:
    spec = pod_spec(doc)
    if spec is None:
        return []
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` -> (name, tag, digest); a registry port is not a tag."""
    name, _, digest = image.partition("@")
    tag = None
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest or None


def _retag(image: str, entry: Doc) -> str:
    name, tag, digest = split_image(image)
    if name != entry["name"]:
        return image
    new_name = entry.get("newName", name)
    if "digest" in entry:
        return f"{new_name}@{entry['digest']}"
    if "newTag" in entry:
        return f"{new_name}:{entry['newTag']}"
    return new_name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def _check_unique(docs: list[Doc], directory: Path) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for doc in docs:
        key = (
            _group(doc),
            str(doc.get("kind")),
            str(doc.get("metadata", {}).get("namespace", "")),
            _name(doc),
        )
        if key in seen:
            raise KustomizeError(f"{directory}: duplicate object {key}")
        seen.add(key)
