"""deploy/Dockerfile and /.dockerignore, read as text (no Docker engine needed)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOYMENT = REPO / "deploy" / "k8s" / "base" / "deployment.yaml"

BUILD_TOOLS = re.compile(r"\b(apt-get|apt|apk|gcc|g\+\+|cc|make|build-essential|python3?-dev)\b")


@dataclass
class Stage:
    image: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [rest for name, rest in self.instructions if name == instruction]

    def index(self, instruction: str) -> list[int]:
        return [i for i, (name, _rest) in enumerate(self.instructions) if name == instruction]


def parse_dockerfile(text: str) -> list[Stage]:
    """Split a Dockerfile into stages of (INSTRUCTION, arguments)."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comment lines may sit inside a continued instruction too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        name, _, rest = full.partition(" ")
        instructions.append((name.upper(), rest.strip()))
    assert not pending, "dangling line continuation"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for name, rest in instructions:
        if name == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            image = re.sub(
                r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0]
            )
            alias = words[2] if len(words) > 2 and words[1].upper() == "AS" else None
            stages.append(Stage(image, alias))
        elif not stages:
            assert name == "ARG", f"{name} before the first FROM"
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((name, rest))
    return stages


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list), f"not the exec (JSON) form: {rest}"
    return [str(item) for item in value]


def env_pairs(stage: Stage) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for rest in stage.args("ENV"):
        for word in shlex.split(rest):
            key, _, value = word.partition("=")
            pairs[key] = value
    return pairs


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


@pytest.fixture(scope="module")
def supervisor_container() -> dict[str, object]:
    docs = [d for d in yaml.safe_load_all(DEPLOYMENT.read_text(encoding="utf-8")) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_multi_stage_on_python_311_slim_pinned_by_digest(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    for stage in stages:
        name, _, digest = stage.image.partition("@")
        assert name == "python:3.11-slim", stage.image
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"not pinned by digest: {stage.image}"


def test_build_stage_makes_wheels_with_the_supervisor_and_postgres_extras(
        stages: list[Stage]) -> None:
    runs = " ".join(rest for stage in stages[:-1] for rest in stage.args("RUN"))
    assert re.search(r"pip wheel\b.*\.\[supervisor,postgres\]", runs), runs


def test_dependencies_are_built_before_the_source_is_copied(stages: list[Stage]) -> None:
    """A source edit must not rebuild every dependency wheel: the layer that builds them
    sees pyproject.toml alone."""
    build = stages[0]
    copies = [(i, rest) for i, (name, rest) in enumerate(build.instructions) if name == "COPY"]
    (whole_tree,) = [i for i, rest in copies if rest.split()[:-1] == ["."]]
    first = [i for i, rest in copies if i < whole_tree]
    assert first and all(build.instructions[i][1].split()[:-1] == ["pyproject.toml"]
                         for i in first)
    deps = [i for i, (name, rest) in enumerate(build.instructions)
            if name == "RUN" and "pip wheel" in rest and "-r " in rest]
    assert deps and deps[0] < whole_tree
    after = [rest for i, (name, rest) in enumerate(build.instructions)
             if name == "RUN" and i > whole_tree and "pip wheel" in rest]
    assert after and all("--no-deps" in rest for rest in after), after


def test_dependency_list_covers_the_installed_extras(stages: list[Stage]) -> None:
    """The requirement list the Dockerfile derives from pyproject.toml, run here."""
    import subprocess
    import sys

    (command,) = [rest for name, rest in stages[0].instructions
                  if name == "RUN" and "tomllib" in rest]
    script = shlex.split(command.split(">")[0])[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    names = {re.split(r"[\[<>=]", line)[0].lower() for line in out}
    assert {"redis", "sqlalchemy", "alembic", "psutil", "psycopg"} <= names
    assert "echomq" not in names


def test_runtime_installs_the_wheels_offline(final: Stage) -> None:
    runs = " ".join(final.args("RUN"))
    assert "pip install" in runs
    assert "--no-index" in runs, "the runtime stage must not reach an index"
    assert "echomq[supervisor,postgres]" in runs


def test_runtime_has_no_build_tools_or_source(final: Stage) -> None:
    for rest in final.args("RUN"):
        assert not BUILD_TOOLS.search(rest), rest
    for rest in final.args("COPY") + final.args("ADD"):
        sources = [w for w in rest.split() if not w.startswith("--")][:-1]
        assert "." not in sources, f"the runtime stage copies the source tree: {rest}"


def test_runtime_user_is_numeric_and_not_root(final: Stage, supervisor_container: dict) -> None:
    users = final.args("USER")
    assert users, "the runtime stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, "USER must be a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    assert max(final.index("RUN")) < max(final.index("USER")), "install as root, then drop"
    assert supervisor_container["securityContext"]["runAsUser"] == int(uid)


def test_entrypoint_and_cmd(final: Stage) -> None:
    (entrypoint,) = final.args("ENTRYPOINT")
    assert exec_form(entrypoint) == ["echomq-supervisor"]
    (cmd,) = final.args("CMD")
    assert exec_form(cmd) == ["start"]


def test_exposes_the_health_port(final: Stage, supervisor_container: dict) -> None:
    exposed = {word.split("/")[0] for rest in final.args("EXPOSE") for word in rest.split()}
    env = {item["name"]: item.get("value") for item in supervisor_container["env"]}
    assert env["ECHOMQ_HEALTH_PORT"] in exposed


def test_python_is_unbuffered(final: Stage) -> None:
    env = env_pairs(final)
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1", "the root filesystem is read-only"


# --------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (Go filepath.Match plus `**`) as a regex."""
    out = ""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(char, re.escape(char))
        i += 1
    return re.compile(out + r"\Z")


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether Docker leaves ``path`` (relative, with /) out of the build context."""
    excluded = False
    parts = path.split("/")
    for raw in patterns:
        negated = raw.startswith("!")
        pattern = raw[1:] if negated else raw
        pattern = pattern.strip().strip("/")
        regex = _pattern_regex(pattern)
        # a pattern that matches a parent directory covers everything below it
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        matched = any(regex.match(prefix) for prefix in prefixes)
        if matched:
            excluded = not negated
    return excluded


@pytest.fixture(scope="module")
def ignore_patterns() -> list[str]:
    assert DOCKERIGNORE.is_file(), "Docker reads .dockerignore from the context root"
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_pattern_matcher_follows_docker() -> None:
    assert dockerignore_excludes([".git"], ".git/HEAD")
    assert dockerignore_excludes(["**/__pycache__"], "echomq/__pycache__/x.pyc")
    assert dockerignore_excludes(["*.md", "!README.md"], "NOTES.md")
    assert not dockerignore_excludes(["*.md", "!README.md"], "README.md")
    assert not dockerignore_excludes(["docs"], "echomq/docs.py")


def test_context_leaves_out_local_and_secret_files(ignore_patterns: list[str]) -> None:
    for path in (
        ".git/config",
        ".venv/bin/python",
        ".env",
        "echomq/__pycache__/x.pyc",
        "floor.sqlite3",
        "tests/conftest.py",
        "deploy/k8s/base/secret.yaml",
    ):
        assert dockerignore_excludes(ignore_patterns, path), path


def _wheel_inputs() -> list[str]:
    """What `pip wheel .` reads, per pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    needed = ["pyproject.toml"]
    readme = project["project"].get("readme")
    if isinstance(readme, str):
        needed.append(readme)
    package_dir = project["tool"]["setuptools"].get("package-dir", {})

    def source(package: str) -> str:
        # the longest mapped prefix (echomq.supervisor -> supervisor), else the dotted path
        for prefix in sorted(package_dir, key=len, reverse=True):
            if package == prefix or package.startswith(prefix + "."):
                rest = package[len(prefix):].lstrip(".").replace(".", "/")
                return "/".join(part for part in (package_dir[prefix], rest) if part)
        return package.replace(".", "/")

    for package in project["tool"]["setuptools"]["packages"]:
        directory = REPO / source(package)
        needed.append(f"{source(package)}/__init__.py")
        if directory.is_dir():
            needed += [
                str(path.relative_to(REPO))
                for path in sorted(directory.iterdir())
                if path.is_file() and path.suffix not in {".pyc", ".pyo"}
            ]
    for package, globs in project["tool"]["setuptools"].get("package-data", {}).items():
        for pattern in globs:
            needed.append(f"{source(package)}/{pattern.replace('*', 'x')}")
    return needed


def test_context_keeps_what_the_wheel_needs(ignore_patterns: list[str]) -> None:
    needed = _wheel_inputs()
    assert "migrations/alembic.ini" in needed and "echomq/lua/x.lua" in needed
    excluded = [path for path in needed if dockerignore_excludes(ignore_patterns, path)]
    assert not excluded, f".dockerignore drops files the wheel needs: {excluded}"
