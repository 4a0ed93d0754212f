"""The two images: what their Dockerfiles promise, and that the services image's build works.

No container engine exists here, so the build stage of docker/Dockerfile is replayed the way
Docker would run it: the build context filtered by docker/Dockerfile.dockerignore, the stubs
generated with grpcio-tools, and the package built as a wheel from that context. The wheel must
hold every module the services import, or the image starts and fails on its first import.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helm.helm_support import CHART, PORTS, REPO_ROOT, SERVICES

SERVICES_DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
SANDBOX_DOCKERFILE = REPO_ROOT / "docker" / "sandbox" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / "docker" / "Dockerfile.dockerignore"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def stages(path: Path) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for instruction in instructions(path):
        if instruction[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(instruction)
    return out


def last(stage, name):
    values = [args for word, args in stage if word == name]
    return values[-1] if values else None


def test_services_image_is_multi_stage_slim_and_non_root():
    build, runtime = stages(SERVICES_DOCKERFILE)
    for stage in (build, runtime):
        image = stage[0][1].split()[0]
        assert re.fullmatch(r"python:3\.11-slim-\w+", image), image  # pinned, slim, the project's Python
    assert "grpc_tools.protoc" in " ".join(args for _, args in build)
    runtime_text = " ".join(args for _, args in runtime)
    assert "grpcio-tools" not in runtime_text and "apt-get" not in runtime_text  # no build tools shipped
    assert "COPY --from=build /opt/agentmesh /opt/agentmesh" in [f"COPY {a}" for w, a in runtime if w == "COPY"]
    user = last(runtime, "USER")
    uid = int(user.split(":")[0])
    assert uid >= 10000
    assert json.loads(last(runtime, "ENTRYPOINT")) == ["agentmesh", "serve"]
    assert json.loads(last(runtime, "CMD"))[0] in SERVICES
    assert {int(p) for p in last(runtime, "EXPOSE").split()} == set(PORTS.values())
    # The chart runs the pods as the image's user.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["securityContext"]["runAsUser"] == uid


def test_sandbox_image_has_the_tools_agents_use_and_runs_non_root():
    (stage,) = stages(SANDBOX_DOCKERFILE)
    assert re.fullmatch(r"python:3\.11-slim-\w+", stage[0][1])
    installed = " ".join(args for word, args in stage if word == "RUN")
    for tool in ("bash", "git", "curl", "jq", "ripgrep", "findutils", "grep", "sed", "gawk", "tar", "unzip", "procps"):
        assert re.search(rf"\b{tool}\b", installed), tool
    assert "rm -rf /var/lib/apt/lists/*" in installed
    uid = int(last(stage, "USER").split(":")[0])
    assert uid >= 10000
    assert last(stage, "WORKDIR") == "/workspace"
    env = last(stage, "ENV")
    assert "HOME=/tmp" in env  # writable with a read-only root filesystem
    assert last(stage, "ENTRYPOINT") is None  # the executor supplies the command


# --- the build stage, replayed ------------------------------------------------------------------


def ignore_rules() -> list[tuple[bool, str]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def _pattern(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex: `**` crosses directories, `*` and `?` do not."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def included(rel: str, rules) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    keep = True
    for negate, pattern in rules:
        if any(_pattern(pattern).match(c) for c in candidates):
            keep = negate
    return keep


@pytest.fixture(scope="module")
def build_context(tmp_path_factory) -> Path:
    rules = ignore_rules()
    context = tmp_path_factory.mktemp("context")
    reincluded = {pattern.split("/")[0] for negate, pattern in rules if negate}
    for top in REPO_ROOT.iterdir():
        # Skip whole excluded trees (.git, the venvs) unless a "!" pattern reaches inside them.
        if not included(top.name, rules) and top.name not in reincluded:
            continue
        for path in [top] if top.is_file() else top.rglob("*"):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if path.is_file() and included(rel, rules):
                target = context / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return context


def test_the_context_holds_what_the_dockerfile_copies_and_nothing_generated(build_context):
    (build, _runtime) = stages(SERVICES_DOCKERFILE)
    for word, args in build:
        if word == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (build_context / source).exists(), f"COPY {source}: excluded by the .dockerignore"
    assert not list(build_context.rglob("*_pb2.py")), "stale generated stubs would shadow the protos"
    assert not list(build_context.rglob("__pycache__"))
    assert not (build_context / "tests").exists() and not (build_context / "helm").exists()


def test_the_built_package_holds_every_module_the_services_import(build_context, tmp_path):
    protos = sorted(str(p.relative_to(build_context)) for p in (build_context / "protos").rglob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", "protos", "--python_out=lib", "--pyi_out=lib",
         "--grpc_python_out=lib", *protos],
        cwd=build_context, check=True, capture_output=True,
    )
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=build_context, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("agentmesh-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    # Every Python file of the source tree, under the import name the package-dir mapping gives it.
    roots = {"lib/agentmesh": "agentmesh", "cli": "agentmesh/cli"}
    roots.update({f"services/{s}": f"agentmesh/{s}" for s in SERVICES})
    expected = set()
    for source, target in roots.items():
        for path in (build_context / source).rglob("*.py"):
            expected.add(f"{target}/{path.relative_to(build_context / source).as_posix()}")
    assert any(n.endswith("_pb2_grpc.py") for n in expected)  # the generated stubs are part of it
    missing = sorted(expected - names)
    assert not missing, (
        f"the image would lack {len(missing)} modules, e.g. {missing[:5]}: list every package in "
        "pyproject.toml [tool.setuptools] packages"
    )
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "agentmesh = agentmesh.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
