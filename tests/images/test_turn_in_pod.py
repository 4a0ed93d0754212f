"""The five services from the services image, in one podman pod, run a tool-using turn.

The model is the scripted server; the turn's tool call runs in its own sandbox pod from the
sandbox image (podman kube play of the executor's Job template), and what the program saw of
itself there comes back through tools, agent and gateway to the model and the client.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc
from tests.images.podman import SERVICE_UID, SERVICES
from tests.images.test_sandbox_pod import SHOW_IDENTITY, proc_status
from tests.support.llm_server import reply, tool_call

# The first test builds the images (minutes on a fresh machine: debootstrap, apt, pip).
# One xdist worker runs every image test: they share one build and one podman stack.
pytestmark = [pytest.mark.images, pytest.mark.timeout(1800), pytest.mark.xdist_group("images")]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_container_answers_health_checks_as_non_root(stack, service):
    health = health_pb2_grpc.HealthStub(stack.channel(service))
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    state = stack.podman.inspect(stack.containers[service])
    assert state["State"]["Running"] and state["Config"]["User"] == f"{SERVICE_UID}:{SERVICE_UID}"
    # The service's process, seen from the host: the image's user, no capabilities.
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{state['State']['Pid']}/status").read_text().splitlines() if ":\t" in line)
    assert status["Uid"].split()[0] == str(SERVICE_UID) and int(status["CapEff"], 16) == 0


def test_a_tool_using_turn_across_the_five_containers(stack):
    command = f"{SHOW_IDENTITY}; echo from-the-pod > note.txt"
    stack.llm.add(reply("", tool_call("shell", {"command": command})), reply("The sandbox ran as 10001."))
    gateway = gateway_pb2_grpc.GatewayStub(stack.channel("gateway"))
    events = list(gateway.Chat(gateway_pb2.ChatRequest(session_id="turn-1", message="who are you in the sandbox?"), timeout=180))
    payloads = [e.WhichOneof("payload") for e in events]
    assert payloads[0] == "run_started" and payloads[-1] == "run_finished", payloads

    (result,) = [e.tool_result.result for e in events if e.WhichOneof("payload") == "tool_result"]
    print(result.stdout)  # shown with -rP: id and /proc/self/status inside the sandbox pod
    assert not result.is_error, result.output
    assert f"uid={SERVICE_UID}" in result.stdout
    status = proc_status(result.stdout)
    assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    assert events[-1].run_finished.final_text == "The sandbox ran as 10001."

    # The model got the pod's output as the tool's answer; the file is in the session's workspace.
    tool_messages = [m for m in stack.llm.requests[-1].body["messages"] if m["role"] == "tool"]
    assert f"uid={SERVICE_UID}" in tool_messages[-1]["content"]
    assert (stack.workspaces / "turn-1" / "note.txt").read_text() == "from-the-pod\n"
    played = next(m for m in reversed(stack.kube.played) if m["metadata"]["labels"]["agentmesh.io/session"] == "turn-1")
    # The executor's command: the workspace-quota wrapper around the model's shell command.
    assert played["spec"]["containers"][0]["command"][-3:] == ["/bin/sh", "-c", command]
