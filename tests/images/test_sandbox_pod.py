"""The tools service's sandbox pods, run by a real container runtime.

The tools service runs from the services image (as in the chart: uid 10001, read-only root)
with AGENTMESH_SANDBOX=kubernetes; each call's Job is the executor's own (k8s_job.build_job),
and its pod runs under `podman kube play` from the sandbox image. Results come back the way the
executor reads them in a cluster: the pod's container status and its log, through the API.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from agentmesh.internal.v1 import tools_service_pb2, tools_service_pb2_grpc
from agentmesh.v1 import tools_pb2
from tests.images.podman import SERVICE_UID

# The first test builds the images (minutes on a fresh machine: debootstrap, apt, pip).
# One xdist worker runs every image test: they share one build and one podman stack.
pytestmark = [pytest.mark.images, pytest.mark.timeout(1800), pytest.mark.xdist_group("images")]

STATUS_FIELDS = "Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp"
SHOW_IDENTITY = f"id; grep -E '^({STATUS_FIELDS}):' /proc/self/status"


def shell(stack, command: str, session_id: str, call_id: str = "c1", timeout_s: float = 60) -> tools_pb2.ToolResult:
    stub = tools_service_pb2_grpc.ToolsStub(stack.channel("tools"))
    request = tools_service_pb2.ExecuteRequest(session_id=session_id, call_id=call_id, name="shell",
                                       arguments_json=json.dumps({"command": command}), timeout_s=timeout_s)
    # The tools service takes calls from the agent only: this test signs as the agent does.
    return stub.Execute(request, timeout=180, metadata=stack.signed_as("agent", "tools")).result


def proc_status(output: str) -> dict[str, str]:
    return dict(re.findall(rf"^({STATUS_FIELDS}):\s+(.+)$", output, re.M))


def played_for(stack, session_id: str) -> dict:
    return next(m for m in reversed(stack.kube.played) if m["metadata"]["labels"]["agentmesh.io/session"] == session_id)


def no_pods_left(stack, timeout_s: float = 15) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := stack.kube.live_pods()) and time.monotonic() < deadline:
        time.sleep(0.3)
    return left


def test_a_call_runs_non_root_read_only_without_capabilities(stack):
    result = shell(stack, f"{SHOW_IDENTITY}; touch /probe; echo written > out.txt; pwd", "sec-1")
    print(result.stdout)  # shown with -rP: what the sandboxed program sees of itself
    assert not result.is_error, result.output

    assert f"uid={SERVICE_UID}" in result.stdout and f"gid={SERVICE_UID}" in result.stdout
    status = proc_status(result.stdout)
    assert status["Uid"].split() == [str(SERVICE_UID)] * 4
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, f"{caps}: {status[caps]}"
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # a seccomp filter is loaded (the runtime's default profile)
    assert "touch: cannot touch '/probe': Read-only file system" in result.stdout
    assert result.stdout.rstrip().endswith("/workspace")
    written = stack.workspaces / "sec-1" / "out.txt"
    assert written.read_text() == "written\n" and written.stat().st_uid == SERVICE_UID

    # The pod podman ran is the executor's template, securityContext and limits as built.
    played = played_for(stack, "sec-1")
    container = played["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["limits"]["memory"] == "128Mi"
    state = stack.kube.terminated[played["metadata"]["name"]]["container"]
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    assert state["HostConfig"]["Memory"] == 128 * 2**20
    assert state["Config"]["User"] == f"{SERVICE_UID}:{SERVICE_UID}"
    assert no_pods_left(stack) == []


def test_the_workspace_is_the_sessions_own_sub_path(stack):
    assert not shell(stack, "echo secret-of-a > mine.txt", "sub-a").is_error
    result = shell(stack, "ls -a /workspace; cat /workspace/../sub-a/mine.txt 2>/dev/null; find / -name mine.txt 2>/dev/null; echo end", "sub-b")
    assert not result.is_error, result.output
    # Session b's /workspace is its own empty directory; a's file is nowhere in its file system.
    assert result.stdout.split() == [".", "..", "end"], result.stdout
    played = played_for(stack, "sub-b")
    mount = next(m for m in played["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/workspace")
    volume = next(v for v in played["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == str(stack.workspaces / "sub-b")


def test_a_memory_hog_is_oom_killed_and_reported(stack):
    hog = "python3 -c 'b = []\nwhile True: b.append(bytearray(8 << 20))'"
    result = shell(stack, hog, "oom-1")
    assert result.is_error and result.error_kind == "oom", result.output
    assert result.exit_code == 137
    assert "128Mi" in result.output
    state = stack.kube.terminated[played_for(stack, "oom-1")["metadata"]["name"]]
    assert state["terminated"]["reason"] == "OOMKilled"
    assert no_pods_left(stack) == []


def test_exit_code_and_output_come_back(stack):
    result = shell(stack, "echo to-stdout; echo to-stderr >&2; exit 3", "exit-1")
    assert result.is_error and result.exit_code == 3, result.output
    assert "to-stdout" in result.stdout and "to-stderr" in result.stdout  # a pod log holds both streams
    assert no_pods_left(stack) == []
