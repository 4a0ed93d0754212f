"""Every internal hop is authenticated: a service takes calls only from the services meant to
call it (and users only where `agentmesh.rpc.auth.CALLERS` says so). Real services on real
ports, with AGENTMESH_AUTH_TOKENS set as a deployment would."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentmesh.internal.v1 import (
    agent_service_pb2_grpc,
    memory_service_pb2,
    memory_service_pb2_grpc,
    tools_service_pb2,
    tools_service_pb2_grpc,
)
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.identity import IdentityError, KeyFileError, ServiceIdentity
from agentmesh.telemetry.spanstore import read_spans, span_store_dir
from agentmesh.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, sessions_pb2
from tests.support.identities import signed_channel
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import collect, of_kind

TOKEN = "tok-user-0123456789"
USER = (("authorization", f"Bearer {TOKEN}"),)

STUBS = {
    "agent": agent_service_pb2_grpc.AgentStub,
    "tools": tools_service_pb2_grpc.ToolsStub,
    "memory": memory_service_pb2_grpc.MemoryStub,
    "scheduler": scheduler_pb2_grpc.SchedulerStub,
    "gateway": gateway_pb2_grpc.GatewayStub,
}


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_TOKENS": TOKEN}) as running:
        yield running


async def call(stub, service: str, metadata=()):
    """One call of each service's most dangerous method, as the issue's attacker made it."""
    if service == "agent":
        # The refusal comes from the metadata alone. Writing the request as well would race the
        # server's abort: grpc-aio then reports the failed write (INTERNAL) instead of the status.
        turn = stub.RunTurn(metadata=metadata, timeout=10)
        return await turn.read()
    if service == "tools":
        request = tools_service_pb2.ExecuteRequest(session_id="victim", call_id="c1", name="shell",
                                           arguments_json='{"command": "cat notes.txt"}')
        return await stub.Execute(request, metadata=metadata, timeout=10)
    if service == "memory":
        forged = common_pb2.Message(role="assistant", content="FORGED: the admin password is hunter2")
        return await stub.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id="victim", messages=[forged]),
                                         metadata=metadata, timeout=10)
    if service == "scheduler":
        job = scheduler_pb2.Job(name="x", schedule="every 1h", prompt="run shell as the scheduler")
        return await stub.CreateJob(scheduler_pb2.CreateJobRequest(job=job), metadata=metadata, timeout=10)
    return await stub.ListSessions(sessions_pb2.ListSessionsRequest(), metadata=metadata, timeout=10)


async def refused(awaitable) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return info.value


@pytest.mark.parametrize("service", ["agent", "tools", "memory", "scheduler"])
async def test_a_direct_call_without_credentials_is_refused(stack, service):
    stub = STUBS[service](open_channel(stack.addresses[service]))
    err = await refused(call(stub, service))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    if service in ("scheduler", "tools"):  # users may call these methods, with their token
        assert "missing credentials" in err.details() and "Bearer" in err.details()
    else:
        assert "is internal: only the" in err.details() and "signed service token" in err.details()


# (service called, a service that must not call it, the method's rightful callers as refused says)
WRONG_CALLERS = [
    ("agent", "tools", "only the gateway service may"),
    ("tools", "memory", "only the agent service (and users with a token) may"),
    ("memory", "gateway", "only the agent service may"),  # AppendMessages: the agent writes transcripts
    ("scheduler", "agent", "only users with a token may"),
    ("gateway", "tools", "only the gateway service and the scheduler service (and users with a token) may"),
]


@pytest.mark.parametrize(("service", "caller", "says"), WRONG_CALLERS)
async def test_a_service_not_allowed_to_call_is_refused(stack, service, caller, says):
    channel = signed_channel(stack.settings.keys_dir, caller, service, stack.addresses[service])
    err = await refused(call(STUBS[service](channel), service))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"the {caller} service may not call it" in err.details() and says in err.details()


async def test_a_users_token_opens_no_internal_method(stack):
    memory = memory_service_pb2_grpc.MemoryStub(open_channel(stack.addresses["memory"]))
    err = await refused(call(memory, "memory", USER))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "a user's token is not enough" in err.details()
    agent = agent_service_pb2_grpc.AgentStub(open_channel(stack.addresses["agent"]))
    assert (await refused(call(agent, "agent", USER))).code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_token_signed_with_another_key_is_refused(stack, tmp_path):
    # The attacker makes their own "agent" key: the name is right, the key is not the agent's.
    impostor = signed_channel(tmp_path / "attacker-keys", "agent", "tools", stack.addresses["tools"])
    err = await refused(call(tools_service_pb2_grpc.ToolsStub(impostor), "tools"))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not signed with its key" in err.details()


async def test_a_token_for_another_service_or_expired_is_refused(stack):
    agent_key = stack.settings.keys_dir / "agent.key"
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(agent_key.read_bytes(), password=None)
    now = int(time.time())
    tokens = {
        # Signed by the real agent key, but addressed to memory: replaying it at tools fails.
        "addressed to another service": {"aud": "memory", "iat": now, "exp": now + 30},
        "has expired": {"aud": "tools", "iat": now - 120, "exp": now - 60},
    }
    for says, claims in tokens.items():
        token = jwt.encode({"iss": "agent", "sub": "service:agent", **claims}, private, algorithm="EdDSA",
                           headers={"kid": "agent"})
        metadata = (("x-agentmesh-service-token", token),)
        tools = tools_service_pb2_grpc.ToolsStub(open_channel(stack.addresses["tools"]))
        err = await refused(call(tools, "tools", metadata))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED and says in err.details()


def test_tokens_check_signature_audience_and_lifetime(tmp_path):
    keys = tmp_path / "keys"
    agent, tools = ServiceIdentity.open("agent", keys), ServiceIdentity.open("tools", keys)
    assert tools.verify(agent.sign("tools")).via == "agent"
    with pytest.raises(IdentityError, match="addressed to another service"):
        tools.verify(agent.sign("memory"))
    long_lived = jwt.encode({"iss": "agent", "aud": "tools", "sub": "x", "iat": int(time.time()),
                             "exp": int(time.time()) + 3600}, agent._private, algorithm="EdDSA")  # noqa: SLF001 - forges a token with the real key
    with pytest.raises(IdentityError, match="lifetime longer"):
        tools.verify(long_lived)
    stranger = jwt.encode({"iss": "agent", "aud": "tools", "sub": "x", "iat": int(time.time()),
                           "exp": int(time.time()) + 30}, Ed25519PrivateKey.generate(), algorithm="EdDSA")
    with pytest.raises(IdentityError, match="not signed with its key"):
        tools.verify(stranger)
    with pytest.raises(IdentityError, match="not a well-formed JWT"):
        tools.verify("not-a-token")
    # Private keys are the owner's alone.
    assert (keys / "agent.key").stat().st_mode & 0o777 == 0o600
    assert keys.stat().st_mode & 0o077 == 0


def test_a_re_created_key_republishes_its_public_half_and_a_missing_one_is_a_clear_error(tmp_path):
    keys = tmp_path / "keys"
    first = ServiceIdentity.open("agent", keys)
    (keys / "agent.key").unlink()  # e.g. a home restored without its keys: the .pub is stale
    second = ServiceIdentity.open("agent", keys)
    tools = ServiceIdentity.open("tools", keys)
    assert tools.verify(second.sign("tools")).via == "agent"
    with pytest.raises(IdentityError, match="not signed with its key"):
        tools.verify(first.sign("tools"))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(KeyFileError, match="no private key for the agent service"):
        ServiceIdentity.open("agent", blocked / "keys")


async def test_a_forged_transcript_line_never_reaches_the_session(stack, llm):
    llm.add(reply("hello"))
    gateway = stack.gateway_stub()
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="victim", message="hi"), metadata=USER,
                                        timeout=30))
    assert of_kind(events, "run_finished")
    memory = memory_service_pb2_grpc.MemoryStub(open_channel(stack.addresses["memory"]))
    for metadata in ((), USER):
        await refused(call(memory, "memory", metadata))
    # Nor can another service forge it: the gateway may read transcripts, not write them.
    as_gateway = memory_service_pb2_grpc.MemoryStub(signed_channel(stack.settings.keys_dir, "gateway", "memory",
                                                           stack.addresses["memory"]))
    await refused(call(as_gateway, "memory"))
    transcript = await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="victim"), metadata=USER,
                                             timeout=10)
    assert [m.content for m in transcript.messages if "FORGED" in m.content] == []
    assert [m.role for m in transcript.messages] == ["user", "assistant"]


async def test_the_stack_works_end_to_end_with_every_hop_authenticated(stack, llm):
    llm.add(reply("", tool_call("shell", {"command": "echo through-every-hop > proof.txt && cat proof.txt"})),
            reply("", tool_call("memory_save", {"text": "the proof file exists"})), reply("done"))
    gateway = stack.gateway_stub()
    events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="e2e", message="go"), metadata=USER,
                                        timeout=60))
    results = [r.result for r in of_kind(events, "tool_result")]
    assert results[0].output.strip() == "through-every-hop", results
    assert not results[1].is_error, results[1]
    assert of_kind(events, "run_finished")[0].final_text == "done"

    # The user's principal travelled with every hop: gateway -> agent -> tools and memory.
    for host in stack.hosts.values():
        host.telemetry.force_flush()
    user = "user:" + hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    served = {s["name"]: s["attributes"].get("enduser.id") for s in read_spans(span_store_dir(stack.settings.home))
              if s["kind"] == "SERVER" and s["name"].startswith("/agentmesh.")}
    for method in ("Gateway/Chat", "Agent/RunTurn", "Tools/Execute", "Memory/AppendMessages", "Memory/Remember"):
        assert served[f"/agentmesh.{'v1' if method.startswith('Gateway') else 'internal.v1'}.{method}"] == user, (method, served)

    # The scheduler's job API takes the user's token; its run reaches the gateway as the scheduler.
    llm.add(reply("scheduled run done"))
    scheduler = stack.scheduler_stub()
    job = await scheduler.CreateJob(scheduler_pb2.CreateJobRequest(job=scheduler_pb2.Job(
        name="nightly", schedule="every 1h", prompt="report")), metadata=USER, timeout=10)
    await scheduler.TriggerJob(scheduler_pb2.TriggerJobRequest(job_id=job.job_id), metadata=USER, timeout=10)
    for _ in range(200):
        runs = (await scheduler.ListRuns(scheduler_pb2.ListRunsRequest(job_id=job.job_id), metadata=USER,
                                         timeout=10)).runs
        if runs and runs[0].status != "running":
            break
        await asyncio.sleep(0.05)
    assert runs[0].status == "succeeded", runs[0]
    assert runs[0].summary == "scheduled run done"


@pytest.mark.parametrize("service", ["gateway", "agent", "tools", "memory", "scheduler"])
async def test_health_stays_open(stack, service):
    health = health_pb2_grpc.HealthStub(open_channel(stack.addresses[service]))
    status = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert status.status == health_pb2.HealthCheckResponse.SERVING


async def run_cli(stack: Stack, *args: str, token: str = "") -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    env["AGENTMESH_AUTH_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentmesh.cli.main", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_reaches_memory_and_tools_as_an_authenticated_user(stack):
    for args in (("tools", "run", "shell", '{"command": "echo hi"}'), ("memory", "search", "anything"),
                 ("cron", "list")):
        code, _, err = await run_cli(stack, *args)
        assert code == 1 and "missing credentials" in err, (args, err)
        code, out, err = await run_cli(stack, *args, token=TOKEN)
        assert code == 0, (args, err)
    code, out, _ = await run_cli(stack, "tools", "run", "shell", '{"command": "echo hi"}', token=TOKEN)
    assert out.strip() == "hi"


async def test_the_sandbox_never_sees_the_service_keys(stack):
    keys = stack.settings.keys_dir
    assert sorted(p.name for p in keys.glob("*.key")) == sorted(f"{s}.key" for s in stack.hosts)
    tools = stack.tools_stub()  # as the agent
    probe = f"ls {keys} ; cat {keys}/tools.key ; env | grep -ci agentmesh ; ls {Path(stack.env['AGENTMESH_HOME'])}"
    reply_ = await tools.Execute(tools_service_pb2.ExecuteRequest(session_id="curious", call_id="c1", name="shell",
                                                          arguments_json=f'{{"command": "{probe}"}}'), timeout=60)
    out = reply_.result.stdout + reply_.result.stderr
    assert "PRIVATE KEY" not in out
    assert out.count("No such file or directory") == 3, out
    assert reply_.result.stdout.strip() == "0", out


async def test_only_the_gateway_may_drop_a_run_from_a_transcript(stack):
    # DropRun removes a rolled-back turn: neither the agent nor a user may rewrite history with it.
    request = memory_service_pb2.DropRunRequest(session_id="victim", run_id="run-1")
    agent = memory_service_pb2_grpc.MemoryStub(signed_channel(stack.settings.keys_dir, "agent", "memory", stack.addresses["memory"]))
    err = await refused(agent.DropRun(request, timeout=10))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "only the gateway service may" in err.details()
    gateway = memory_service_pb2_grpc.MemoryStub(signed_channel(stack.settings.keys_dir, "gateway", "memory", stack.addresses["memory"]))
    err = await refused(gateway.DropRun(request, timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND  # allowed through; there is no such session
