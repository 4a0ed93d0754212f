"""Per-tenant limits from the policy file: turns at once, model tokens per day, workspace disk —
each refused with RESOURCE_EXHAUSTED naming the limit, before anything runs or is written."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from agentmesh.tenancy import token_digest
from agentmesh.v1 import gateway_pb2, tools_pb2
from tests.e2e.conftest import collect, of_kind, rpc_error
from tests.support.llm_server import reply
from tests.support.stack import Stack
from tests.support.turns import LiveTurn, wait_until

TOKENS = {"busy": "tok-busy-0123456789abc", "thrifty": "tok-thrifty-0123456789", "small": "tok-small-0123456789ab"}


def auth(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name]}"),)


@pytest.fixture
async def stack(tmp_path: Path, llm):
    policy = {
        "tenants": {
            "busy": {"namespaces": ["busy"], "limits": {"concurrent_turns": 1}},
            "thrifty": {"namespaces": ["thrifty"], "limits": {"tokens_per_day": 10}},
            "small": {"namespaces": ["small"], "limits": {"workspace_mb": 1}},
        },
        "service_accounts": [{"name": name, "token_sha256": token_digest(token), "tenant": name, "role": "admin"}
                             for name, token in TOKENS.items()],
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_POLICY": str(path)}) as running:
        yield running


async def test_a_tenant_at_its_concurrent_turns_is_refused_until_one_ends(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("slow", delay_s=2), reply("next"))
    first = LiveTurn(gateway, "one", "take your time", metadata=auth("busy"))
    await wait_until(lambda: llm.requests)
    err = await rpc_error(collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="two", message="me too"),
                                               metadata=auth("busy"), timeout=30)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'busy' already runs 1 turns at once, its limit (limits.concurrent_turns)" in err.details()
    assert of_kind(await first.finished(), "run_finished")
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="two", message="now?"),
                                        metadata=auth("busy"), timeout=30))
    assert of_kind(events, "run_finished")[0].final_text == "next"


async def test_a_tenant_past_its_tokens_for_the_day_is_refused(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("spent", usage=(10, 5)))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="t", message="hi"),
                                        metadata=auth("thrifty"), timeout=30))
    assert of_kind(events, "run_finished")[0].usage.total_tokens == 15
    err = await rpc_error(collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="t", message="again"),
                                               metadata=auth("thrifty"), timeout=30)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'thrifty' has used its 10 model tokens for today (limits.tokens_per_day)" in err.details()
    assert len(llm.requests) == 1
    # Another tenant is not affected.
    llm.add(reply("fine"))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="b", message="hi"),
                                        metadata=auth("busy"), timeout=30))
    assert of_kind(events, "run_finished")


async def test_a_workspace_at_its_tenants_disk_limit_takes_no_more(stack):
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="w"), metadata=auth("small"))
    upload = tools_pb2.WriteWorkspaceFileRequest(session_id="w", path="big.bin", content=b"x" * (1536 * 1024))
    await gateway.WriteWorkspaceFile(upload, metadata=auth("small"))
    more = tools_pb2.WriteWorkspaceFileRequest(session_id="w", path="more.txt", content=b"y")
    err = await rpc_error(gateway.WriteWorkspaceFile(more, metadata=auth("small")))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'small' allows 1 MiB per workspace (limits.workspace_mb)" in err.details()
    listing = await gateway.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="w"), metadata=auth("small"))
    assert [e.name for e in listing.entries] == ["big.bin"]
