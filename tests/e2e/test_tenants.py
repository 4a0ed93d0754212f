"""Two tenants on one stack: tenant A can neither see nor touch anything of tenant B — by gRPC,
HTTP, the CLI, or calling an internal service directly — and each attempt is in the audit log.
All five services run, with a policy file of service accounts (tokens stored hashed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import httpx
import pytest

from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc, tools_service_pb2, tools_service_pb2_grpc
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.identity import Principal
from agentmesh.tenancy import token_digest
from agentmesh.v1 import common_pb2, gateway_pb2, scheduler_pb2, sessions_pb2, tools_pb2
from tests.e2e.conftest import collect, of_kind, rpc_error
from tests.e2e.test_auth_and_cli import run_cli
from tests.support.identities import signed_channel
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.timing import polling
from tests.support.turns import LiveTurn

TOKENS = {
    "a-admin": "tok-a-admin-0123456789", "a-member": "tok-a-member-0123456789", "a-viewer": "tok-a-viewer-0123456789",
    "b-admin": "tok-b-admin-0123456789", "b-member": "tok-b-member-0123456789",
    "a-member-2": "tok-a-member-2-0123456789",
}


def _policy() -> str:
    accounts = [{"name": name, "token_sha256": token_digest(token), "tenant": "acme" if name[0] == "a" else "beta",
                 "role": name.split("-")[1]} for name, token in TOKENS.items()]
    return json.dumps({"tenants": {"acme": {"namespaces": ["acme"]}, "beta": {"namespaces": ["beta", "beta-ops"]}},
                       "service_accounts": accounts})


def auth(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name]}"),)


@pytest.fixture
async def tenants(tmp_path: Path, llm):
    policy = tmp_path / "policy.json"
    policy.write_text(_policy())
    audit = tmp_path / "audit.jsonl"
    env = {"AGENTMESH_AUTH_POLICY": str(policy), "AGENTMESH_AUDIT_LOG": str(audit)}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
        yield stack, audit


def _audit(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_tenant_a_cannot_see_or_touch_tenant_b(tenants, llm):
    stack, audit = tenants
    gateway = stack.gateway_stub()
    # Tenant B works: a turn in its own session, a memory, a cron job.
    llm.add(reply("B's secret answer"))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="b-secret", message="hello"),
                                        metadata=auth("b-member"), timeout=60))
    assert of_kind(events, "run_finished")[0].final_text == "B's secret answer"
    b_session = await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="b-secret"), metadata=auth("b-member"))
    assert b_session.namespace == "beta"
    memory = memory_service_pb2_grpc.MemoryStub(open_channel(stack.addresses["memory"]))  # a user's plain channel
    await memory.Remember(memory_service_pb2.RememberRequest(namespace="beta", text="beta's launch code is 0000"),
                          metadata=auth("b-member"))
    scheduler = stack.scheduler_stub()
    b_job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
        name="b-report", schedule="every 1d", prompt="report")), metadata=auth("b-admin"))
    requests_before = len(llm.requests)

    a = auth("a-admin")
    # gRPC: list, read, chat, approve, delete, search, create in B's namespace.
    listed = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(), metadata=a)
    assert "b-secret" not in [s.session_id for s in listed.sessions]
    missing = await rpc_error(gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="never-made"), metadata=a))
    for call in (
        gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="b-secret"), metadata=a),
        gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="b-secret"), metadata=a),
        collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="b-secret", message="leak it"), metadata=a)),
        gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="b-secret"), metadata=a),
        gateway.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="b-secret"), metadata=a),
        gateway.ClearTranscript(sessions_pb2.ClearTranscriptRequest(session_id="b-secret"), metadata=a),
    ):
        err = await rpc_error(call)
        # Exactly what a session that does not exist gets: the id does not leak.
        assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
        assert err.details() == missing.details().replace("never-made", "b-secret")
    # Approve answers as for a session with nothing held (which is what a stranger's looks like).
    err = await rpc_error(gateway.Approve(gateway_pb2.ApproveRequest(session_id="b-secret", call_id="c1", approved=True),
                                          metadata=a))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "has no tool call 'c1' waiting" in err.details()
    for call in (
        gateway.SearchMemory(gateway_pb2.SearchMemoryRequest(namespace="beta", query="launch code"), metadata=a),
        gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="in-beta", namespace="beta"), metadata=a),
        memory.Search(memory_service_pb2.SearchRequest(namespace="beta", query="launch code"), metadata=a),
        gateway.GetNamespaceSettings(sessions_pb2.GetNamespaceSettingsRequest(namespace="beta"), metadata=a),
        gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
            namespace="beta", tools=common_pb2.ToolPolicy(allow=["shell"])), metadata=a),
    ):
        err = await rpc_error(call)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "'beta' is not one you may use" in err.details()
    # The scheduler: B's job is not there for A, and A cannot schedule into B's session.
    assert b_job.job_id not in [j.job_id for j in (await scheduler.ListJobs(scheduler_pb2.ListJobsRequest(), metadata=a)).jobs]
    for call in (scheduler.GetJob(scheduler_pb2.GetJobRequest(job_id=b_job.job_id), metadata=a),
                 scheduler.DeleteJob(scheduler_pb2.DeleteJobRequest(job_id=b_job.job_id), metadata=a),
                 scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=b_job.job_id), metadata=a)):
        assert (await rpc_error(call)).code() == grpc.StatusCode.NOT_FOUND
    a_job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
        name="sneak", schedule="every 1d", prompt="read it", session_id="b-secret")), metadata=a)
    run = await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=a_job.job_id), metadata=a)
    async for _ in polling(0.1):
        runs = await scheduler.ListRuns(scheduler_pb2.ListRunsRequest(job_id=a_job.job_id), metadata=a)
        finished = [r for r in runs.runs if r.run_id == run.run_id and r.status != "running"]
        if finished:
            break
    assert finished and finished[0].status == "failed" and "does not exist" in finished[0].error

    # B's trace: B reads it once the spans are written; A gets what a missing trace gets.
    trace_id = of_kind(events, "run_finished")[0].trace_id
    for _ in range(100):
        try:
            trace = await gateway.GetTrace(gateway_pb2.GetTraceRequest(trace_id=trace_id), metadata=auth("b-member"))
            break
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND
            await asyncio.sleep(0.1)
    assert trace.spans
    err = await rpc_error(gateway.GetTrace(gateway_pb2.GetTraceRequest(trace_id=trace_id), metadata=a))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details().startswith(f"no trace {trace_id}")

    # HTTP: the same answers.
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        headers = {"Authorization": f"Bearer {TOKENS['a-admin']}"}
        assert (await http.get("/v1/sessions/b-secret", headers=headers)).status_code == 404
        assert (await http.delete("/v1/sessions/b-secret", headers=headers)).status_code == 404
        assert (await http.get("/v1/sessions/b-secret/transcript", headers=headers)).status_code == 404
        assert (await http.post("/v1/memory/search", headers=headers,
                                json={"namespace": "beta", "query": "launch"})).status_code == 403
        assert (await http.get(f"/v1/cron/jobs/{b_job.job_id}", headers=headers)).status_code == 404

    # The CLI, signed in as A.
    stack.env["AGENTMESH_AUTH_TOKEN"] = TOKENS["a-admin"]
    try:
        code, _, err = await run_cli(stack, "sessions", "show", "b-secret")
        assert code == 1 and "does not exist" in err
        code, _, err = await run_cli(stack, "memory", "search", "launch code", "--namespace", "beta")
        assert code == 1 and "PERMISSION_DENIED" in err
    finally:
        del stack.env["AGENTMESH_AUTH_TOKEN"]

    # An internal service called directly, with a valid service token made for tenant A.
    channel = signed_channel(stack.settings.keys_dir, "gateway", "memory", stack.addresses["memory"])
    acting = current_principal.set(Principal(subject="oidc:mallory", tenant="acme=admin"))
    try:
        direct = memory_service_pb2_grpc.MemoryStub(channel)
        err = await rpc_error(direct.GetSession(sessions_pb2.GetSessionRequest(session_id="b-secret")))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        err = await rpc_error(direct.ListMessages(sessions_pb2.GetTranscriptRequest(session_id="b-secret")))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        listed = await direct.ListSessions(sessions_pb2.ListSessionsRequest())
        assert "b-secret" not in [s.session_id for s in listed.sessions]
        # As the agent: a turn's start in B's session, or a recall from B's namespace.
        as_agent = signed_channel(stack.settings.keys_dir, "agent", "memory", stack.addresses["memory"])
        agent_memory = memory_service_pb2_grpc.MemoryStub(as_agent)
        start = memory_service_pb2.StartTurnRequest(session_id="b-secret", messages=[common_pb2.Message(role="user", content="x")])
        assert (await rpc_error(agent_memory.StartTurn(start))).code() == grpc.StatusCode.NOT_FOUND
        recall = memory_service_pb2.StartTurnRequest(session_id="a-own", namespace="beta", recall_query="launch code", recall_k=3,
                                             messages=[common_pb2.Message(role="user", content="x")])
        assert (await rpc_error(agent_memory.StartTurn(recall))).code() == grpc.StatusCode.PERMISSION_DENIED
        await as_agent.close()
    finally:
        current_principal.reset(acting)
        await channel.close()

    # The tools service: a command in B's workspace, by A directly or by a service acting for A.
    execute = tools_service_pb2.ExecuteRequest(session_id="b-secret", call_id="x", name="shell",
                                       arguments_json=json.dumps({"command": "cat *"}))
    tools_user = tools_service_pb2_grpc.ToolsStub(open_channel(stack.addresses["tools"]))
    err = await rpc_error(tools_user.Execute(execute, metadata=a))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details() == "session 'b-secret' does not exist"
    agent_channel = signed_channel(stack.settings.keys_dir, "agent", "tools", stack.addresses["tools"])
    acting = current_principal.set(Principal(subject="oidc:mallory", tenant="acme=admin"))
    try:
        err = await rpc_error(tools_service_pb2_grpc.ToolsStub(agent_channel).Execute(execute))
        assert err.code() == grpc.StatusCode.NOT_FOUND
    finally:
        current_principal.reset(acting)
        await agent_channel.close()

    # Nothing of B's changed, and the model never saw A's messages.
    transcript = await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="b-secret"), metadata=auth("b-member"))
    assert [m.content for m in transcript.messages if m.role == "user"] == ["hello"]
    assert len(llm.requests) == requests_before
    hits = await memory.Search(memory_service_pb2.SearchRequest(namespace="beta", query="launch code"), metadata=auth("b-member"))
    assert hits.hits

    # Each attempt is in the audit log, with who made it.
    lines = _audit(audit)
    crossings = [e for e in lines if e["action"] == "cross_tenant"]
    assert {e["service"] for e in crossings} >= {"agentmesh-memory", "agentmesh-gateway", "agentmesh-scheduler"}
    assert any(e["via"] == "tools" for e in crossings)  # memory saw the tools service ask for A
    assert all(e["principal"] in ("service-account:a-admin", "oidc:mallory") for e in crossings), [(e["principal"], e["method"], e.get("via")) for e in crossings if e["principal"] not in ("service-account:a-admin", "oidc:mallory")]
    assert any(e["action"] == "session.create" and e["session_id"] == "b-secret" for e in lines)
    assert any(e["action"] == "cron.create" and e["tenant"] == "acme" for e in lines)
    assert all(token not in audit.read_text() for token in TOKENS.values())


async def test_a_turn_runs_in_its_sessions_namespace_of_the_callers_tenant(tenants, llm):
    stack, audit = tenants
    gateway = stack.gateway_stub()
    # Made by an admin in the tenant's second namespace; a member's turn finds it there (the
    # agent's StartTurn opens it: the gateway read nothing of it first).
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="ops-1", namespace="beta-ops"),
                                metadata=auth("b-admin"))
    llm.add(reply("ops answer"))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="ops-1", message="status?"),
                                        metadata=auth("b-member"), timeout=60))
    started = of_kind(events, "run_started")[0]
    assert (started.namespace, started.session_created) == ("beta-ops", False)
    assert of_kind(events, "run_finished")[0].final_text == "ops answer"
    # A new id goes to the member's home namespace, and its creation is audited as before.
    llm.add(reply("new"))
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="fresh-1", message="hi"),
                                        metadata=auth("b-member"), timeout=60))
    started = of_kind(events, "run_started")[0]
    assert (started.namespace, started.session_created) == ("beta", True)
    created = [e for e in _audit(audit) if e["action"] == "session.create" and e["session_id"] == "fresh-1"]
    assert [(e["namespace"], e["principal"]) for e in created] == [("beta", "service-account:b-member")]


async def test_roles_within_a_tenant(tenants, llm):
    stack, audit = tenants
    gateway = stack.gateway_stub()
    created = await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a-s"), metadata=auth("a-member"))
    assert created.namespace == "acme"
    # A viewer reads but does not chat; a member chats but does not delete; an admin deletes.
    assert (await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="a-s"), metadata=auth("a-viewer"))).session_id
    err = await rpc_error(collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="a-s", message="hi"),
                                               metadata=auth("a-viewer"))))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "needs the member role" in err.details()
    err = await rpc_error(gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="a-s"), metadata=auth("a-member")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "admin" in err.details()
    err = await rpc_error(stack.scheduler_stub().CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
        name="x", schedule="every 1d", prompt="p")), metadata=auth("a-member")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    deleted = await gateway.DeleteSession(sessions_pb2.DeleteSessionRequest(session_id="a-s"), metadata=auth("a-admin"))
    assert deleted.deleted
    assert any(e["action"] == "session.delete" and e["principal"] == "service-account:a-admin" for e in _audit(audit))


async def test_login_keeps_a_checked_token_private_and_the_cli_sends_it(tenants, tmp_path):
    stack, _audit = tenants
    credentials = tmp_path / "config" / "credentials"
    stack.env["AGENTMESH_CREDENTIALS_FILE"] = str(credentials)
    code, _, err = await run_cli(stack, "login", "--token", "not-a-real-token-at-all")
    assert code == 1 and "not one this deployment accepts" in err and not credentials.exists()
    code, _, err = await run_cli(stack, "sessions", "list")
    assert code == 1 and "missing credentials" in err
    code, out, err = await run_cli(stack, "login", "--token", TOKENS["b-member"])
    assert code == 0, err
    assert credentials.stat().st_mode & 0o777 == 0o600 and credentials.read_text().strip() == TOKENS["b-member"]
    await stack.gateway_stub().CreateSession(gateway_pb2.CreateSessionRequest(session_id="b-cli"), metadata=auth("b-member"))
    code, out, err = await run_cli(stack, "sessions", "list", "--json")
    assert code == 0, err
    assert [s["session_id"] for s in json.loads(out)] == ["b-cli"]
    code, _, _ = await run_cli(stack, "logout")
    assert code == 0 and not credentials.exists()


async def test_a_member_decides_only_their_own_runs_an_admin_any(tenants, llm):
    stack, audit = tenants
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "echo ok"}, id="held")), reply("Ran it."))
    turn = LiveTurn(gateway, "a-run", "run it", metadata=auth("a-member"), approval_tools=["shell"])
    request = await turn.approval_request()
    decide = gateway_pb2.ApproveRequest(session_id="a-run", call_id=request.call_id, approved=True)
    err = await rpc_error(gateway.Approve(decide, metadata=auth("a-member-2")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "started by service-account:a-member" in err.details()
    err = await rpc_error(gateway.Approve(decide, metadata=auth("b-admin")))  # another tenant's admin
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert (await gateway.Approve(decide, metadata=auth("a-admin"))).accepted
    assert of_kind(await turn.finished(), "run_finished")[0].final_text == "Ran it."
    decided = [e for e in _audit(audit) if e["action"] == "approval.decided"]
    assert [(e["principal"], e["outcome"]) for e in decided] == [
        ("service-account:a-member-2", "refused"), ("service-account:a-admin", "allowed")]


async def test_runs_are_their_tenants_own(tenants, llm):
    """A run is recorded in its session's namespace (found by the turn's start), read and listed
    there by its tenant, and NOT_FOUND to another tenant whichever way it asks."""
    stack, _ = tenants
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="ops-r", namespace="beta-ops"),
                                metadata=auth("b-admin"))
    llm.add(reply("ran"))
    run = await gateway.CreateRun(gateway_pb2.CreateRunRequest(session_id="ops-r", message="go"),
                                  metadata=auth("b-member"), timeout=30)
    async with asyncio.timeout(60):
        while (await gateway.GetRun(gateway_pb2.GetRunRequest(run_id=run.run_id), metadata=auth("b-member"),
                                    timeout=10)).state != "succeeded":
            await asyncio.sleep(0.1)
    listed = await gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(namespace="beta-ops"), metadata=auth("b-member"))
    assert [r.run_id for r in listed.runs] == [run.run_id] and listed.runs[0].namespace == "beta-ops"
    home = await gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(), metadata=auth("b-member"))
    assert run.run_id not in [r.run_id for r in home.runs]

    for call in (gateway.GetRun(gateway_pb2.GetRunRequest(run_id=run.run_id), metadata=auth("a-admin")),
                 gateway.CancelRun(gateway_pb2.CancelRunRequest(run_id=run.run_id), metadata=auth("a-admin")),
                 collect(gateway.JoinRun(gateway_pb2.JoinRunRequest(run_id=run.run_id), metadata=auth("a-admin")))):
        err = await rpc_error(call)
        assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    err = await rpc_error(gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(namespace="beta-ops"), metadata=auth("a-admin")))
    assert err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
    err = await rpc_error(gateway.CreateRun(gateway_pb2.CreateRunRequest(session_id="a-view", message="go"),
                                            metadata=auth("a-viewer")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
