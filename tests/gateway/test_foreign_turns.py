"""Another tenant's busy session, met with every if_busy policy: the stranger gets exactly what a
session that does not exist gets, and the owner's turn — its sandboxed call included — goes on
untouched. Two tenants in a policy file, all five services over real gRPC, a scripted model."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from agentmesh.tenancy import token_digest
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import LiveTurn, collect, of_kind, wait_until

TOKENS = {"acme": "tok-acme-member-0123456789", "beta": "tok-beta-member-0123456789"}


def auth(tenant: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[tenant]}"),)


@pytest.fixture
async def stack(tmp_path: Path, llm):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "tenants": {"acme": {"namespaces": ["acme"]}, "beta": {"namespaces": ["beta"]}},
        "service_accounts": [{"name": f"{tenant}-member", "token_sha256": token_digest(token), "tenant": tenant,
                              "role": "member"} for tenant, token in TOKENS.items()],
    }))
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_POLICY": str(policy)}) as running:
        yield running


async def _refusal(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await (collect(call) if hasattr(call, "__aiter__") else call)
    return info.value


@pytest.mark.timeout(180)
async def test_a_stranger_cannot_stop_queue_behind_or_detect_another_tenants_turn(stack, llm):
    gateway = stack.gateway_stub()
    # Beta's turn runs a command in the sandbox that waits until the stranger has tried everything.
    workspace = stack.settings.home / "workspaces" / "b-busy"
    llm.add(reply("Working.", tool_call("shell", {"command": "until [ -e go ]; do sleep 0.05; done; echo done > finished.txt"})),
            reply("Beta's answer."))
    owner = LiveTurn(gateway, "b-busy", "do the long job", metadata=auth("beta"))
    await wait_until(lambda: len(owner.of_kind("tool_call")) == 1, timeout=30)

    # What acme gets for a session id nobody uses (Chat would create it, so ask for it).
    missing = await _refusal(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="b-nobody"),
                                                metadata=auth("acme")))
    for policy in ("reject", "enqueue", "interrupt", "rollback"):
        err = await _refusal(gateway.Chat(gateway_pb2.ChatRequest(
            session_id="b-busy", message="stop that", options=gateway_pb2.ChatOptions(if_busy=policy)),
            metadata=auth("acme"), timeout=30))
        assert err.code() == grpc.StatusCode.NOT_FOUND, (policy, err.details())
        assert err.details() == missing.details().replace("b-nobody", "b-busy"), policy
    (workspace / "go").touch()

    events = await owner.finished()
    finished = of_kind(events, "run_finished")
    assert [f.stop_reason for f in finished] == ["completed"]
    assert finished[0].final_text == "Beta's answer."
    assert not of_kind(events, "tool_result")[0].result.is_error  # the sandboxed call was not killed
    assert (workspace / "finished.txt").exists()
    transcript = await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="b-busy"),
                                             metadata=auth("beta"))
    assert [m.content for m in transcript.messages if m.role == "user"] == ["do the long job"]
    assert len(llm.requests) == 2  # no stranger's turn reached the model
