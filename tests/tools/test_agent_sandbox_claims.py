"""Session sandboxes claimed from a cluster's agent-sandbox (a template's `agent_sandbox_pool`,
AGENTMESH_SANDBOX_AGENT_SANDBOX_POOL for `default`): a SandboxClaim per session, the session's
calls through the same supervisor over pods/exec in the claimed pod, the claim deleted with the
session and on idle.

Against the tests' Kubernetes API server with agent-sandbox's API and a stand-in for its
controllers (fake_agent_sandbox.py: claims validated against agent-sandbox's CRD schema, bound to
a warm or a new pod the way its controller binds them; the pods run by the fake kubelet).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from agentmesh.errors import ConfigError
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.tools.sandbox.agent_sandbox import claim_body
from agentmesh.tools.sandbox.templates import SandboxTemplate, TemplateSet, parse_templates
from tests.tools.backends import NAMESPACE
from tests.tools.fake_agent_sandbox import CLAIM_SCHEMA, FakeAgentSandbox, undeclared
from tests.tools.fake_kube import FakeKube
from tests.tools.support import ToolsClient, wait_until

POOL = "python-pool"


@pytest.fixture
def cluster(home):
    fake = FakeAgentSandbox(pools={POOL: 1}).__enter__()
    fake.fill_pools(NAMESPACE)
    yield fake
    fake.__exit__(None, None, None)


def claims_env(fake: FakeKube, home, **extra: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"AGENTMESH_SANDBOX": "kubernetes", "KUBECONFIG": str(fake.kubeconfig(home.parent)),
            "AGENTMESH_SANDBOX_NAMESPACE": NAMESPACE, "AGENTMESH_SANDBOX_ISOLATION": "session",
            "AGENTMESH_SANDBOX_AGENT_SANDBOX_POOL": POOL, "AGENTMESH_SANDBOX_START_TIMEOUT_S": "30", **extra}


async def execute(tools: ToolsClient, name: str, arguments: dict, session_id: str = "s1", call_id: str = "c1",
                  namespace: str = "", template: str = ""):
    reply = await tools.stub.Execute(tools_service_pb2.ExecuteRequest(
        session_id=session_id, call_id=call_id, name=name, arguments_json=json.dumps(arguments), namespace=namespace,
        sandbox_template=template), timeout=120)
    return reply.result


def running_pods(fake: FakeAgentSandbox) -> set[str]:
    with fake.cond:
        return {key[1] for key, pod in fake.pods.items() if pod["status"].get("phase") == "Running"}


async def test_a_sessions_calls_run_in_the_pod_its_claim_is_bound_to(cluster, home):
    warm_pod = cluster.warm[POOL][0]
    assert await wait_until(lambda: warm_pod in running_pods(cluster))
    async with ToolsClient(home, claims_env(cluster, home)) as tools:
        first = await execute(tools, "shell", {"command": "echo kept > notes.txt; pwd"}, session_id="team.a",
                              namespace="team-a")
        second = await execute(tools, "shell", {"command": "cat notes.txt; exit 3"}, session_id="team.a",
                               call_id="c2", namespace="team-a")
        cell = await execute(tools, "python", {"code": "x = 41"}, session_id="team.a", call_id="c3")
        kept = await execute(tools, "python", {"code": "print(x + 1)"}, session_id="team.a", call_id="c4")
        assert not first.is_error, first.output
        assert second.exit_code == 3 and second.stdout == "kept\n"
        assert not cell.is_error and "42" in kept.output, kept.output
        # One claim, valid under agent-sandbox's schema, owned by the session and its namespace
        # (on the claim and, through additionalPodMetadata, on the pod); no pod of our own.
        assert len(cluster.claims_posted) == 1 and cluster.invalid == [] and cluster.posted == []
        claim = cluster.claims_posted[0]
        assert claim["spec"]["warmPoolRef"] == {"name": POOL}
        for labels in (claim["metadata"]["labels"], claim["spec"]["additionalPodMetadata"]["labels"]):
            assert labels["agentmesh.io/session"] == "team.a" and labels["agentmesh.io/namespace"] == "team-a"
        with cluster.cond:
            adopted = cluster.pods[(NAMESPACE, warm_pod)]["metadata"]["labels"]
        assert adopted["agentmesh.io/session"] == "team.a"
        # Every call went to the warm pod the claim adopted, through one supervisor stream, in the
        # pod's own container.
        assert [pod for pod, _, _ in cluster.execs_served] == [warm_pod]
        assert cluster.execs_served[0][2][:3] == ["python3", "-I", "-c"]
        # Deleting the session's workspace deletes its claim, and agent-sandbox its pod.
        await tools.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="team.a"))
        assert await wait_until(lambda: not cluster.live_claims() and warm_pod not in running_pods(cluster))
    assert ("create", "sandboxclaims") in cluster.requests and ("get", "sandboxes") in cluster.requests
    assert cluster.forbidden == []


async def test_an_idle_claim_is_deleted_and_the_next_call_claims_again(cluster, home):
    async with ToolsClient(home, claims_env(cluster, home, AGENTMESH_SANDBOX_SESSION_IDLE_S="0.5")) as tools:
        first = await execute(tools, "shell", {"command": "echo one"})
        assert first.stdout == "one\n", first.output
        first_claim = cluster.claims_posted[0]["metadata"]["name"]
        assert await wait_until(lambda: first_claim not in cluster.live_claims())
        # The pool's one warm pod is spent: this claim gets a pod of its own (named as the claim).
        again = await execute(tools, "shell", {"command": "echo two"}, call_id="c2")
        assert again.stdout == "two\n", again.output
        second_claim = cluster.claims_posted[1]["metadata"]["name"]
        assert second_claim != first_claim and cluster.execs_served[-1][0] == second_claim
    assert await wait_until(lambda: not cluster.live_claims())


async def test_a_ready_claim_whose_pod_is_not_running_yet_is_looked_at_again(cluster, home):
    cluster.ready_early = True
    cluster.warm[POOL].clear()  # a cold pod: the claim is Ready before the pod exists, and never changes after
    async with ToolsClient(home, claims_env(cluster, home, AGENTMESH_SANDBOX_START_TIMEOUT_S="20")) as tools:
        result = await execute(tools, "shell", {"command": "echo late"})
    assert result.stdout == "late\n", result.output


async def test_a_claim_not_ready_by_the_deadline_is_deleted_and_says_why(cluster, home):
    cluster.hold = True
    async with ToolsClient(home, claims_env(cluster, home, AGENTMESH_SANDBOX_START_TIMEOUT_S="1")) as tools:
        result = await execute(tools, "shell", {"command": "echo never"})
    assert result.is_error and result.error_kind == "start_timeout", result.output
    assert "did not make the session's sandbox ready within 1 s" in result.output
    assert "DependenciesNotReady: Pod does not exist" in result.output and POOL in result.output
    assert cluster.live_claims() == []


async def test_a_claim_on_a_pool_the_cluster_lacks_fails_at_once(cluster, home):
    async with ToolsClient(home, claims_env(cluster, home, AGENTMESH_SANDBOX_AGENT_SANDBOX_POOL="no-such-pool")) as tools:
        result = await execute(tools, "shell", {"command": "echo never"})
    assert result.is_error and result.error_kind == "sandbox_error", result.output
    assert 'WarmPoolNotFound: SandboxWarmPool "no-such-pool" not found' in result.output
    assert cluster.live_claims() == []


async def test_a_template_names_its_pool_and_the_others_keep_their_own_pods(cluster, home):
    path = home.parent / "templates.json"
    path.write_text(json.dumps({"claimed": {"isolation": "session", "agentSandboxPool": POOL}}))
    env = claims_env(cluster, home, AGENTMESH_SANDBOX_TEMPLATES=str(path), AGENTMESH_SANDBOX_AGENT_SANDBOX_POOL="")
    async with ToolsClient(home, env) as tools:
        claimed = await execute(tools, "shell", {"command": "echo claimed"}, template="claimed")
        own = await execute(tools, "shell", {"command": "echo own"}, session_id="s2", call_id="c2")
    assert claimed.stdout == "claimed\n" and own.stdout == "own\n", (claimed.output, own.output)
    assert [c["metadata"]["labels"]["agentmesh.io/template"] for c in cluster.claims_posted] == ["claimed"]
    assert [p["kind"] for p in cluster.posted] == ["Pod"]  # `default`'s session pod, ours


async def test_without_agent_sandbox_or_its_grants_the_call_says_what_is_missing(home):
    with FakeKube() as plain:  # no agent-sandbox API: anything else is answered 403, as RBAC would
        async with ToolsClient(home, claims_env(plain, home)) as tools:
            result = await execute(tools, "shell", {"command": "echo never"})
    assert result.is_error and result.error_kind == "sandbox_unavailable", result.output
    assert "needs create/list/watch/delete on sandboxclaims" in result.output


def test_the_claim_validates_with_its_owner_on_claim_and_pod():
    body = claim_body("agentmesh-claim-1", POOL, "default", "s1", tenant="acme", namespace="team-a")
    jsonschema.validate(body, CLAIM_SCHEMA)
    assert undeclared(body, CLAIM_SCHEMA) == []
    owner = body["spec"]["additionalPodMetadata"]["labels"]
    assert owner == {"agentmesh.io/session": "s1", "agentmesh.io/claim": "agentmesh-claim-1",
                     "agentmesh.io/tenant": "acme", "agentmesh.io/namespace": "team-a"}


def test_a_pool_needs_session_isolation():
    with pytest.raises(ConfigError, match="set isolation: session"):
        TemplateSet(SandboxTemplate("default"), parse_templates(json.dumps({"claimed": {"agentSandboxPool": POOL}})))
    with pytest.raises(ConfigError, match="must name a SandboxWarmPool"):
        parse_templates(json.dumps({"claimed": {"isolation": "session", "agentSandboxPool": "Not A Name"}}))


async def test_a_claim_no_replica_uses_any_more_is_swept(cluster, home):
    # A claim left by a replica that went away (a crash, a scale-down): made long ago, never used since.
    left = claim_body("agentmesh-claim-left", POOL, "default", "gone")
    left["metadata"].update(namespace=NAMESPACE, creationTimestamp="2020-01-01T00:00:00Z")
    with cluster.cond:
        cluster.claims[(NAMESPACE, "agentmesh-claim-left")] = left
    async with ToolsClient(home, claims_env(cluster, home, AGENTMESH_SANDBOX_SESSION_IDLE_S="0.5")) as tools:
        result = await execute(tools, "shell", {"command": "echo mine"})
        assert result.stdout == "mine\n", result.output
        assert await wait_until(lambda: "agentmesh-claim-left" not in cluster.live_claims())
