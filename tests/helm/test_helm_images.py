"""The two images: what their Dockerfiles promise, checked everywhere (no container engine needed).

tests/images builds both with `make images` and runs them under podman where podman is
installed; these checks hold the Dockerfiles' shape, the build context and the wheel's contents
on every machine, and the tags `make images` gives match the chart's defaults.
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
DATA_DOCKERFILE = REPO_ROOT / "docker" / "sandbox-data" / "Dockerfile"
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


def base_default(path: Path) -> str:
    """The default of the BASE build argument declared before the first FROM."""
    for word, args in instructions(path):
        if word == "FROM":
            break
        if word == "ARG" and args.startswith("BASE="):
            return args.split("=", 1)[1]
    raise AssertionError(f"{path}: no ARG BASE=... before the first FROM")


def test_services_image_is_multi_stage_minimal_and_non_root():
    # The base is a build argument: the public slim image by default, a local one where no
    # registry is reachable (make images); the runtime stage starts from nothing.
    assert re.fullmatch(r"python:3\.11-slim-bookworm", base_default(SERVICES_DOCKERFILE))
    build, runtime = stages(SERVICES_DOCKERFILE)
    assert build[0][1] == "${BASE} AS build"
    assert runtime[0][1] == "scratch AS runtime"
    assert [a for w, a in runtime if w == "COPY"] == ["--from=build /rootfs/ /"]
    assert not [w for w, _ in runtime if w == "RUN"]  # nothing to run it with: no shell in the image
    user = last(runtime, "USER")
    uid = int(user.split(":")[0])
    assert uid >= 10000
    assert json.loads(last(runtime, "ENTRYPOINT")) == ["/opt/agentmesh/bin/agentmesh", "serve"]
    assert json.loads(last(runtime, "CMD"))[0] in SERVICES
    assert {int(p) for p in last(runtime, "EXPOSE").split()} == set(PORTS.values())
    # The chart runs the pods as the image's user.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["securityContext"]["runAsUser"] == uid


def test_sandbox_image_has_the_tools_agents_use_and_runs_non_root():
    assert re.fullmatch(r"python:3\.11-slim-bookworm", base_default(SANDBOX_DOCKERFILE))
    (stage,) = stages(SANDBOX_DOCKERFILE)
    assert stage[0][1] == "${BASE}"
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


def test_make_images_tags_what_the_chart_runs():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    plan = subprocess.run(["make", "-n", "--no-print-directory", "images"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    tags = re.findall(r" -t (\S+)", plan)
    assert tags == [
        f"{values['image']['repository']}:{values['image']['tag'] or app_version}",
        f"{values['sandbox']['image']['repository']}:{values['sandbox']['image']['tag'] or app_version}",
        # The `data` template's image: documented for sandbox.templates, not a chart default.
        f"{values['sandbox']['image']['repository']}-data:{values['sandbox']['image']['tag'] or app_version}",
    ]
    # Built on the sandbox image this same run tagged, from the wheels it downloaded.
    data_build = next(line for line in plan.splitlines() if "sandbox-data/Dockerfile" in line)
    assert f"--build-arg SANDBOX={tags[1]}" in data_build and data_build.endswith(" build/wheels/data")


def test_data_image_is_the_sandbox_image_with_a_venv_of_the_wheels_first_on_path():
    build, runtime = stages(DATA_DOCKERFILE)
    assert build[0][1] == "${SANDBOX} AS build" and runtime[0][1] == "${SANDBOX}"
    installed = " ".join(args for word, args in build if word == "RUN")
    assert "--no-index" in installed and "-r /wheels/requirements.txt" in installed  # no registry at build time
    assert [a for w, a in runtime if w == "COPY"] == ["--from=build /opt/data /opt/data"]
    assert not [w for w, _ in runtime if w == "RUN"]
    assert last(runtime, "USER") == last(stages(SANDBOX_DOCKERFILE)[0], "USER")
    env = last(runtime, "ENV")
    assert "PATH=/workspace/.local/bin:/opt/data/bin:" in env and "MPLBACKEND=Agg" in env
    wanted = {re.split(r"[<>=]", line)[0] for line in (DATA_DOCKERFILE.parent / "requirements.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert wanted == {"numpy", "pandas", "matplotlib"}


# --- the build context and the wheel ------------------------------------------------------------


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


def test_the_context_holds_what_the_dockerfile_copies_and_nothing_else():
    rules = ignore_rules()
    (build, _runtime) = stages(SERVICES_DOCKERFILE)
    sources = [source for word, args in build if word == "COPY" and not args.startswith("--from") for source in args.split()[:-1]]
    assert sources == ["build/wheels/deps", "build/wheels/agentmesh-*.whl", "docker/slim_root.py"]
    for path in ("build/wheels/deps/grpcio-1-cp311.whl", "build/wheels/agentmesh-0.1.0-py3-none-any.whl", "docker/slim_root.py"):
        assert included(path, rules), f"{path}: excluded by the .dockerignore"
    for path in ("lib/agentmesh/config.py", "tests/conftest.py", "helm/agentmesh/values.yaml", ".git/config", ".venv/bin/python", "docker/Dockerfile",
                 "build/wheels/data/numpy-2.2.6-cp311.whl"):
        assert not included(path, rules), f"{path}: sent to the build for nothing"


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> Path:
    """What `make wheels` builds the wheel from, copied so the build leaves nothing in the tree."""
    tree = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "protos", "lib", "cli", "services"):
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*_pb2*.py*", ".generated"))
        else:
            shutil.copy2(source, tree / name)
    return tree


def test_the_built_package_holds_every_module_the_services_import(source_tree, tmp_path):
    protos = sorted(str(p.relative_to(source_tree)) for p in (source_tree / "protos").rglob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", "protos", "--python_out=lib", "--pyi_out=lib",
         "--grpc_python_out=lib", *protos],
        cwd=source_tree, check=True, capture_output=True,
    )
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source_tree, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("agentmesh-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    # Every Python file of the source tree, under the import name the package-dir mapping gives it.
    roots = {"lib/agentmesh": "agentmesh", "cli": "agentmesh/cli"}
    roots.update({f"services/{s}": f"agentmesh/{s}" for s in SERVICES})
    expected = set()
    for source, target in roots.items():
        for path in (source_tree / source).rglob("*.py"):
            expected.add(f"{target}/{path.relative_to(source_tree / source).as_posix()}")
    assert any(n.endswith("_pb2_grpc.py") for n in expected)  # the generated stubs are part of it
    missing = sorted(expected - names)
    assert not missing, (
        f"the image would lack {len(missing)} modules, e.g. {missing[:5]}: list every package in "
        "pyproject.toml [tool.setuptools] packages"
    )
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "agentmesh = agentmesh.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
