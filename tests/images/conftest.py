"""Image tests (marker `images`): the images `make images` builds, run under podman.

Skipped, with the reason, where podman, buildah or runc is missing or not running as root
(`bash .ci/run` installs them). The first test builds the images with `make images` (buildah
caches the layers, and the debootstrapped base is cached, so a rebuild is quick); then one
stack serves the session: the five services from the services image in one podman pod, the
scripted model server, and a Kubernetes API whose kubelet is podman (tests/images/podman_kube.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from agentmesh.rpc.auth import SERVICE_TOKEN_HEADER
from agentmesh.rpc.identity import ServiceIdentity
from tests.images.podman import (
    REPO_ROOT,
    SERVICE_UID,
    SERVICES,
    Podman,
    chart_image,
    free_port,
    listens_on,
    missing_tools,
    owned_directory,
    podman_env,
    wait_serving,
)
from tests.images.podman_kube import PodmanKube
from tests.support.llm_server import ScriptedLLMServer

CLAIM = "agentmesh-workspaces"
NAMESPACE = "agentmesh-sandbox"
BUILD_TIMEOUT_S = 1500


def pytest_collection_modifyitems(config, items):
    reason = ""
    if missing := missing_tools():
        reason = (f"{', '.join(missing)} not installed: the image tests build and run the images with podman, "
                  "buildah and runc (bash .ci/run installs them, with debootstrap)")
    elif os.geteuid() != 0:
        reason = "the image tests need root (rootful podman: cgroup memory limits and bind-mounted volumes)"
    if reason:
        for item in items:
            if "images" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """The images, built from this tree by `make images`; their references are the chart's defaults
    (the `data` template's: the sandbox repository with `-data`)."""
    started = time.monotonic()
    result = subprocess.run(["make", "--no-print-directory", "images"], cwd=REPO_ROOT, env=podman_env(),
                            capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert result.returncode == 0, f"make images failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    print(f"make images: {time.monotonic() - started:.0f} s")
    return {"services": chart_image("services"), "sandbox": chart_image("sandbox"), "data": chart_image("data")}


@pytest.fixture(scope="session")
def podman():
    runner = Podman()
    yield runner
    runner.cleanup()


@dataclass
class PodStack:
    """The five services in one podman pod (host network, so they reach the test's servers on loopback)."""

    podman: Podman
    pod: str
    addresses: dict[str, str]
    containers: dict[str, str]
    llm: ScriptedLLMServer
    kube: PodmanKube
    workspaces: Path
    keys: Path
    channels: list = field(default_factory=list)

    def channel(self, service: str) -> grpc.Channel:
        channel = grpc.insecure_channel(self.addresses[service])
        self.channels.append(channel)
        return channel

    def signed_as(self, caller: str, audience: str) -> tuple[tuple[str, str], ...]:
        """Call metadata with a token `caller` signs for `audience`, as that service would send it."""
        return ((SERVICE_TOKEN_HEADER, ServiceIdentity.open(caller, self.keys).sign(audience)),)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


class PortTaken(Exception):
    pass


def service_keys(scratch: Path) -> Path:
    """Every service's key pair, made once; each container gets the public keys and its own
    private key only, read-only, as the chart mounts them from Secrets."""
    every = scratch / "keys"
    for name in SERVICES:
        ServiceIdentity.open(name, every)
    for name in SERVICES:
        own = owned_directory(scratch / f"keys-{name}")
        for path in [*every.glob("*.pub"), every / f"{name}.key"]:
            (own / path.name).write_bytes(path.read_bytes())
            os.chown(own / path.name, SERVICE_UID, SERVICE_UID)
            (own / path.name).chmod(0o600 if path.suffix == ".key" else 0o644)
    return every


def start_services(podman: Podman, images: dict[str, str], scratch: Path, env: dict[str, str],
                   tools_env: dict[str, str], workspaces: Path, kube_dir: Path, attempt: int):
    """The five containers in one pod on the host's network; (pod, addresses, containers)."""
    addresses = {name: f"127.0.0.1:{free_port()}" for name in SERVICES}
    common = {
        **{f"AGENTMESH_{name.upper()}_ADDR": address for name, address in addresses.items()},
        # The host's network is shared: no fixed port for the gateway's HTTP side either.
        "AGENTMESH_GATEWAY_HTTP_ADDR": f"127.0.0.1:{free_port()}",
        "AGENTMESH_SERVICE_KEYS_DIR": "/etc/agentmesh/keys",
        **env,
    }
    pod = podman.create_pod(f"services-{attempt}", "--network", "host")
    containers: dict[str, str] = {}
    for name in SERVICES:
        home = owned_directory(scratch / f"{name}-{attempt}")
        options = [
            "--pod", pod,
            # What the chart's pods ask of the runtime.
            "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--volume", f"{home}:/var/lib/agentmesh",
            "--volume", f"{scratch / f'keys-{name}'}:/etc/agentmesh/keys:ro",
        ]
        if name == "tools":
            options += ["--volume", f"{workspaces}:/var/lib/agentmesh/workspaces",
                        "--volume", f"{kube_dir}:/etc/agentmesh/kube:ro"]
        for key, value in {**common, **(tools_env if name == "tools" else {})}.items():
            options += ["--env", f"{key}={value}"]
        containers[name] = podman.start_container(f"{name}-{attempt}", images["services"], name, options=tuple(options))
    for name in SERVICES:
        try:
            wait_serving(addresses[name])
        except TimeoutError as exc:
            logs = podman.logs(containers[name])
            podman.run("pod", "rm", "--force", "--time", "0", pod, check=False)
            if "the port is taken" in logs:
                raise PortTaken(logs[-500:]) from None
            raise AssertionError(f"{exc}\n{logs[-3000:]}") from None
        # The answer may have come from another test's service that took the port first (the
        # container then exits, "the port is taken"): the container's own process must listen.
        port = int(addresses[name].rpartition(":")[2])
        if not listens_on(podman.inspect(containers[name])["State"]["Pid"], port):
            logs = podman.logs(containers[name])
            podman.run("pod", "rm", "--force", "--time", "0", pod, check=False)
            raise PortTaken(f"{addresses[name]} answered, but not from the {name} container:\n{logs[-500:]}")
    return pod, addresses, containers


@pytest.fixture(scope="session")
def stack(images, podman):
    scratch = Path(tempfile.mkdtemp(prefix="amtest-images-", dir="/tmp"))
    scratch.chmod(0o711)
    workspaces = owned_directory(scratch / "workspaces")
    kube_dir = scratch / "kube"
    kube_dir.mkdir()
    keys = service_keys(scratch)
    llm = ScriptedLLMServer().start()
    kube = PodmanKube(podman, volumes={CLAIM: workspaces}).__enter__()
    kube.kubeconfig(kube_dir)
    (kube_dir / "kubeconfig.json").chmod(0o644)
    env = {
        "AGENTMESH_LLM_PROVIDER": "openai",
        "AGENTMESH_LLM_BASE_URL": llm.base_url,
        "AGENTMESH_LLM_MODEL": "test-model",
        "AGENTMESH_LLM_API_KEY": "sk-test-secret-key-0123456789",
        "AGENTMESH_LLM_MAX_RETRIES": "1",
        "AGENTMESH_DRAIN_S": "1",
        "AGENTMESH_TRACES": "none",
    }
    tools_env = {
        "AGENTMESH_SANDBOX": "kubernetes",
        "KUBECONFIG": "/etc/agentmesh/kube/kubeconfig.json",
        "AGENTMESH_SANDBOX_NAMESPACE": NAMESPACE,
        "AGENTMESH_SANDBOX_WORKSPACE_PVC": CLAIM,
        "AGENTMESH_SANDBOX_IMAGE": images["sandbox"],
        "AGENTMESH_SANDBOX_MEMORY_LIMIT": "128Mi",
        "AGENTMESH_SANDBOX_START_TIMEOUT_S": "60",
    }
    pod = ""
    containers: dict[str, str] = {}
    try:
        for attempt in range(3):
            try:
                pod, addresses, containers = start_services(podman, images, scratch, env, tools_env, workspaces, kube_dir, attempt)
                break
            except PortTaken:
                # Another program on this shared machine took a chosen port first: new ports.
                if attempt == 2:
                    raise
        running = PodStack(podman, pod, addresses, containers, llm, kube, workspaces, keys)
        yield running
        running.close()
    finally:
        for name in reversed(list(containers)):
            podman.run("stop", "--time", "2", containers[name], check=False)
        if pod:
            podman.run("pod", "rm", "--force", "--time", "0", pod, check=False)
        kube.__exit__(None, None, None)
        llm.close()
        shutil.rmtree(scratch, ignore_errors=True)
