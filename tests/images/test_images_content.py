"""What is inside the two images `make images` builds: this tree's code, non-root, nothing extra."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from agentmesh.tools.sandbox.supervisor_link import BOOT, SUPERVISOR_SOURCE
from tests.images.podman import REPO_ROOT, SERVICE_UID, owned_directory, podman_cwd, podman_env

# The first test builds the images (minutes on a fresh machine: debootstrap, apt, pip).
# One xdist worker runs every image test: they share one build and one podman stack.
pytestmark = [pytest.mark.images, pytest.mark.timeout(1800), pytest.mark.xdist_group("images")]

SITE = "opt/agentmesh/lib/python3.11/site-packages"
# Where each import package's sources live in the tree (pyproject.toml's package-dir).
SOURCE_ROOTS = {"agentmesh/cli": "cli", **{f"agentmesh/{s}": f"services/{s}" for s in ("gateway", "agent", "tools", "memory", "scheduler")}, "agentmesh": "lib/agentmesh"}
# Programs the services never run; their absence is the point of the services image.
NOT_IN_SERVICES = ("bin/sh", "bin/bash", "bin/dash", "usr/bin/ls", "usr/bin/cat", "usr/bin/apt", "usr/bin/apt-get",
                   "usr/bin/dpkg", "usr/bin/curl", "usr/bin/wget", "usr/bin/perl", "usr/bin/gcc", "opt/agentmesh/bin/pip")


@pytest.fixture(scope="module")
def services_root(images, podman) -> Path:
    """The services image's file system, mounted read-only from a container made from it (never started)."""
    name = podman.name("services-fs")
    podman.containers.append(name)
    podman.run("create", "--name", name, images["services"])
    yield Path(podman.text("mount", name).strip())
    podman.run("umount", name, check=False)
    podman.run("rm", "--volumes", name, check=False)


def image_config(podman, image: str) -> dict:
    return json.loads(podman.text("image", "inspect", image))[0]["Config"]


def test_services_image_runs_agentmesh_serve_as_non_root(images, podman):
    config = image_config(podman, images["services"])
    assert config["User"] == f"{SERVICE_UID}:{SERVICE_UID}"
    assert config["Entrypoint"] == ["/opt/agentmesh/bin/agentmesh", "serve"]
    assert config["WorkingDir"] == "/var/lib/agentmesh"


def test_services_image_has_no_shell_tools(images, podman, services_root):
    present = [path for path in NOT_IN_SERVICES if os.path.lexists(services_root / path)]
    assert present == [], f"the services image carries programs no service runs: {present}"
    assert (services_root / "opt/agentmesh/bin/agentmesh").is_file()
    # Nothing to exec into: a shell cannot even start.
    result = podman.run("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", images["services"], "-c", "id", check=False)
    assert result.returncode != 0 and b"/bin/sh" in result.stderr


def test_services_image_carries_this_trees_code(services_root):
    """Every module of the agentmesh wheel inside is byte for byte this tree's (stubs included)."""
    (record_path,) = (services_root / SITE).glob("agentmesh-*.dist-info/RECORD")
    record = record_path.read_text()
    checked = []
    for path, digest, _size in csv.reader(io.StringIO(record)):
        if not path.endswith(".py") or not path.startswith("agentmesh/"):
            continue
        package_path = next(prefix for prefix in SOURCE_ROOTS if path.startswith(prefix + "/"))
        source = REPO_ROOT / SOURCE_ROOTS[package_path] / path[len(package_path) + 1 :]
        assert source.is_file(), f"{path} in the image has no source in this tree"
        expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(source.read_bytes()).digest()).rstrip(b"=").decode()
        assert digest == expected, f"{path} in the image differs from {source.relative_to(REPO_ROOT)}: rebuild with make images"
        checked.append(path)
    assert len(checked) > 100 and "agentmesh/internal/v1/tools_service_pb2_grpc.py" in checked


def test_sandbox_image_has_the_tools_and_nothing_that_reaches_the_cluster(images, podman):
    config = image_config(podman, images["sandbox"])
    assert config["User"] == f"{SERVICE_UID}:{SERVICE_UID}" and config["WorkingDir"] == "/workspace"
    script = (
        "id -u; for t in sh bash python3 git curl jq rg find grep sed awk tar unzip make patch sqlite3; do "
        "command -v $t >/dev/null || echo missing:$t; done; "
        "for t in kubectl helm agentmesh; do command -v $t >/dev/null && echo present:$t; done; "
        "python3 -c 'import kubernetes' 2>/dev/null && echo present:kubernetes-client; "
        "python3 -c 'import agentmesh' 2>/dev/null && echo present:agentmesh; "
        "ls /var/run/secrets 2>/dev/null && echo present:secrets; true"
    )
    output = podman.text("run", "--rm", "--network", "none", images["sandbox"], "/bin/sh", "-c", script).split()
    assert output[0] == str(SERVICE_UID)
    assert [line for line in output[1:] if line.startswith(("missing:", "present:"))] == []


def test_data_image_draws_figures_and_tables_as_the_sandbox_user(images, podman):
    """The `data` template's image: the sandbox image plus numpy, pandas and matplotlib, usable
    as the cluster runs it (read-only root, /tmp an empty writable volume, no network)."""
    config = image_config(podman, images["data"])
    assert config["User"] == f"{SERVICE_UID}:{SERVICE_UID}" and config["WorkingDir"] == "/workspace"
    script = (
        "import os, numpy, pandas, matplotlib.pyplot as plt\n"
        "frame = pandas.DataFrame({'x': numpy.arange(5), 'y': numpy.arange(5) ** 2})\n"
        "frame.plot(x='x', y='y')\n"
        "plt.savefig('/tmp/figure.png')\n"
        "frame.to_csv('/tmp/table.csv', index=False)\n"
        "print(os.getuid(), plt.get_backend().lower(), open('/tmp/figure.png', 'rb').read(8).hex())\n"
        "print(open('/tmp/table.csv').read().splitlines()[-1])\n"
    )
    result = podman.run("run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp:mode=1777",
                        images["data"], "python3", "-I", "-c", script)  # -I: as the session kernel starts
    out, err = result.stdout.decode().split("\n"), result.stderr.decode()
    assert out[:2] == [f"{SERVICE_UID} agg 89504e470d0a1a0a", "4,16"], (out, err)
    assert "Matplotlib created a temporary" not in err and "not writable" not in err, err
    # Everything the sandbox image has is there too.
    tools = podman.text("run", "--rm", "--network", "none", images["data"], "/bin/sh", "-c",
                        "for t in bash git jq rg; do command -v $t >/dev/null || echo missing:$t; done; true")
    assert tools.split() == []


def test_the_session_kernel_in_the_data_image_saves_figures_and_tables(images):
    """The session supervisor's Python kernel, started as a session pod starts it (`python3 -I -c
    BOOT`, the image's PATH), draws a matplotlib figure and shows a DataFrame: the figure saved
    as PNG and the table as Markdown and CSV in the workspace, nothing else written there."""
    source = SUPERVISOR_SOURCE
    cell = {"op": "cell", "id": 1, "cap": 65536, "cpu_s": 60, "fsize": 1 << 28,
            "code": "import matplotlib.pyplot as plt, pandas as pd\nplt.plot([1, 2, 3])\npd.DataFrame({'a': [1, 2]})",
            "env": {"HOME": "/workspace", "LANG": "C.UTF-8"},
            "limits": {"as": 4 << 30, "nproc": 256, "fsize": 1 << 28}}
    with tempfile.TemporaryDirectory(prefix="amtest-data-", dir="/tmp") as scratch:
        workspace = owned_directory(Path(scratch) / "workspace")
        workspace.chmod(0o770)
        # The supervisor answers while its stdin is open (closed, it ends): a pipe held until the reply.
        process = subprocess.Popen(
            ["podman", "run", "--rm", "-i", "--network", "none", "--read-only", "--tmpfs", "/tmp:mode=1777",
             "--volume", f"{workspace}:/workspace", images["data"], "python3", "-I", "-c", BOOT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=podman_env(), cwd=podman_cwd())
        try:
            process.stdin.write((json.dumps(source) + "\n" + json.dumps(cell) + "\n").encode())
            process.stdin.flush()
            answer = json.loads(process.stdout.readline())
        finally:
            process.stdin.close()
            process.wait(timeout=120)
        assert (answer["exit_code"], answer["stderr"]) == (0, "")
        assert answer["stdout"] == "|  | a |\n|---|---|\n| 0 | 1 |\n| 1 | 2 |\n"
        assert (answer["figures"], answer["tables"]) == ([".outputs/figure-1.png"], [".outputs/table-1.csv"])
        assert (workspace / ".outputs/figure-1.png").read_bytes().startswith(b"\x89PNG")
        assert (workspace / ".outputs/table-1.csv").read_text() == ",a\n0,1\n1,2\n"
        assert sorted(p.name for p in workspace.rglob("*")) == [".outputs", "figure-1.png", "table-1.csv"]
