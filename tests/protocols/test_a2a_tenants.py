"""A2A with sign-in on: two tenants in a policy file (service-account tokens). Every agent card
answers, a task is kept in the memory service for its tenant (so another gateway replica answers
tasks/get), and another tenant's caller does not see it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from a2a.types import GetTaskRequest, TaskState

from agentmesh.rpc.launch import start_service
from agentmesh.tenancy import token_digest
from tests.protocols.test_a2a_server import a2a_client, user_message
from tests.support.llm_server import reply
from tests.support.stack import Stack

TOKENS = {"acme": "tok-acme-member-0123456789", "beta": "tok-beta-member-0123456789"}


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[tenant]}"}


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


async def test_every_agent_card_answers_with_sign_in_on(stack):
    async with httpx.AsyncClient(timeout=30) as http:
        for path in ("/.well-known/agent-card.json", "/a2a/acme/.well-known/agent-card.json"):
            public = await http.get(f"{stack.http_url}{path}")  # discovery needs no token
            assert public.status_code == 200, (path, public.text)
            assert public.json()["securityRequirements"] == [{"schemes": {"bearer": {}}}]
            # A stranger learns no namespace's tools; a member of its tenant sees them.
            assert {s["name"] for s in public.json()["skills"]} == {"chat"}
        own = await http.get(f"{stack.http_url}/a2a/acme/.well-known/agent-card.json", headers=auth("acme"))
        assert own.status_code == 200
        assert {"chat", "shell", "write_file"} <= {s["name"] for s in own.json()["skills"]}
        foreign = await http.get(f"{stack.http_url}/a2a/acme/.well-known/agent-card.json", headers=auth("beta"))
        assert foreign.status_code == 200 and {s["name"] for s in foreign.json()["skills"]} == {"chat"}


@pytest.mark.timeout(180)
async def test_a_task_is_kept_for_its_tenant_and_read_on_another_replica(stack, llm):
    other = await start_service("gateway", stack.settings, "127.0.0.1:0")
    try:
        llm.add(reply("Hello, acme."))
        client, http = await a2a_client(f"{stack.http_url}/a2a/acme", streaming=False, headers=auth("acme"))
        try:
            updates = [u async for u in client.send_message(user_message("hello", "ctx-acme"))]
        finally:
            await client.close()
            await http.aclose()
        task_id = updates[-1].task.id
        assert updates[-1].task.status.state == TaskState.TASK_STATE_COMPLETED

        client, http = await a2a_client(f"http://{other.endpoints['http']}/a2a/acme", headers=auth("acme"))
        try:
            task = await client.get_task(GetTaskRequest(id=task_id))
        finally:
            await client.close()
            await http.aclose()
        assert task.id == task_id and task.status.state == TaskState.TASK_STATE_COMPLETED
        assert "".join(p.text for p in task.artifacts[0].parts) == "Hello, acme."

        # Beta's member: acme's endpoint refuses it on either replica, and its own does not know the task.
        for base in (f"{stack.http_url}/a2a/acme", f"http://{other.endpoints['http']}/a2a/acme"):
            async with httpx.AsyncClient(timeout=30) as http:
                refused = await http.post(f"{base}/", headers=auth("beta"), json={
                    "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}})
            assert refused.status_code == 403, (base, refused.text)
            assert "namespace 'acme' is not one you may use" in refused.json()["error"]["message"]
        client, http = await a2a_client(f"http://{other.endpoints['http']}/a2a/beta", headers=auth("beta"))
        missing = None
        try:
            await client.get_task(GetTaskRequest(id=task_id))
        except Exception as exc:  # noqa: BLE001 - the SDK's task-not-found error
            missing = exc
        finally:
            await client.close()
            await http.aclose()
        assert missing is not None and "not found" in str(missing).lower()
    finally:
        await other.stop(grace=1)
        other.telemetry.shutdown()
