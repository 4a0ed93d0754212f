"""Running podman from the image tests: one settings file, unique names, and nothing left behind.

Every podman call uses docker/containers.conf (runc, the cgroupfs manager, ulimits the host
grants), so the tests run the way `make images` builds. Names carry a per-run prefix, so test
runs on the same machine never touch each other's containers or pods; `Podman.cleanup`
removes everything this run created, on failure too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO_ROOT / "docker" / "containers.conf"
CHART = REPO_ROOT / "helm" / "agentmesh"
TOOLS = ("podman", "buildah", "runc")
# In start order: each one's peers are up before it.
SERVICES = ("memory", "tools", "agent", "gateway", "scheduler")
SERVICE_UID = 10001


def missing_tools() -> list[str]:
    # runc lives in /usr/sbin, which a non-login PATH may lack; podman finds it there anyway.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [tool for tool in TOOLS if shutil.which(tool, path=path) is None]


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman_cwd() -> Path:
    """The directory podman runs in. conmon writes an empty `oom` file into its working directory
    when a container is OOM-killed, so podman never runs in the checkout."""
    directory = Path(tempfile.gettempdir()) / "agentmesh-podman"
    directory.mkdir(exist_ok=True)
    return directory


def chart_image(key: str) -> str:
    """The image reference the chart's defaults resolve to (repository:appVersion)."""
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = values["image"] if key == "services" else values["sandbox"]["image"]
    repository = image["repository"] + ("-data" if key == "data" else "")  # the `data` template's image (Makefile DATA_IMAGE)
    return f"{repository}:{image['tag'] or app_version}"


def free_port() -> int:
    """A port free now, below the ephemeral range, so the machine's outgoing connections and other
    tests' port-0 servers cannot take it before the container binds it."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def wait_serving(address: str, timeout_s: float = 60) -> str:
    """The service's grpc.health.v1 status once it answers (raises past the deadline)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} did not answer its health check within {timeout_s:g} s")
            time.sleep(0.2)


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` itself holds a listening TCP socket on `port`: its socket descriptors'
    inodes looked up in its network namespace's tables. A health check answered on a host-network
    port proves only that *something* listens there — on a shared machine, another test's service
    that bound the port between free_port's probe and the container's start."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        tables = [Path(f"/proc/{pid}/net/{table}").read_text() for table in ("tcp", "tcp6")]
    except OSError:  # the process has exited
        return False
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()  # sl, local address:port (hex), remote, state (0A: LISTEN), ..., inode
            if fields[3] == "0A" and fields[9] in inodes and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


class PodmanError(RuntimeError):
    pass


class Podman:
    def __init__(self, prefix: str = "amtest"):
        self.prefix = f"{prefix}-{secrets.token_hex(4)}"
        self.containers: list[str] = []
        self.pods: list[str] = []

    def name(self, what: str) -> str:
        return f"{self.prefix}-{what}"

    def run(self, *args: str, check: bool = True, timeout: float = 120, input: bytes | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(["podman", *args], env=podman_env(), cwd=podman_cwd(), capture_output=True, timeout=timeout, input=input)
        if check and result.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr.decode(errors='replace')[-2000:]}")
        return result

    def text(self, *args: str, **kwargs: Any) -> str:
        return self.run(*args, **kwargs).stdout.decode(errors="replace")

    def inspect(self, name: str) -> dict[str, Any]:
        return json.loads(self.text("container", "inspect", name))[0]

    # --- things this run owns ------------------------------------------------------------------

    def start_container(self, what: str, image: str, *args: str, options: tuple[str, ...] = ()) -> str:
        name = self.name(what)
        self.containers.append(name)
        self.run("run", "--detach", "--name", name, *options, image, *args)
        return name

    def create_pod(self, what: str, *options: str) -> str:
        name = self.name(what)
        self.pods.append(name)
        self.run("pod", "create", "--name", name, *options)
        return name

    def logs(self, name: str) -> str:
        result = self.run("logs", name, check=False)
        return (result.stdout + result.stderr).decode(errors="replace")

    def cleanup(self) -> None:
        for pod in reversed(self.pods):
            self.run("pod", "rm", "--force", "--time", "0", pod, check=False)
        for container in reversed(self.containers):
            self.run("rm", "--force", "--volumes", "--time", "0", container, check=False)
        leftovers = self.text("ps", "--all", "--filter", f"name={self.prefix}", "--format", "{{.Names}}", check=False).split()
        if leftovers:
            print(f"podman: could not remove {leftovers}", file=sys.stderr)


def owned_directory(path: Path, uid: int = SERVICE_UID) -> Path:
    """A host directory the container user can write (the tests run as root)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)
    return path
