"""Skills end to end: a SKILL.md folder added with the CLI is stored per namespace with versions,
listed in the system prompt, loaded on demand by `read_skill`, and its script — copied into the
workspace — runs in the jail. Drafts wait for approval unless the namespace auto-accepts. All
five services over real gRPC, the model a scripted OpenAI-compatible HTTP server."""

from __future__ import annotations

import json

import grpc

from agentmesh.v1 import learning_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.e2e.test_auth_and_cli import run_cli
from tests.e2e.test_standing_instructions import session_in, system_of, user_memory_stub
from tests.support.llm_server import reply, tool_call

SKILL_MD = """---
name: env-report
description: Report what the sandbox sees of the environment.
---
# Environment report

Run `python3 skills/env-report/scripts/report.py` and quote its output.
"""
# Prints what a credential lookup finds: in the jail, nothing of the services' environment.
SCRIPT = "import os\nprint('report: key=' + os.environ.get('AGENTMESH_LLM_API_KEY', 'none') + ' cwd-ok')\n"


def make_skill(root, skill_md: str = SKILL_MD):
    (root / "scripts").mkdir(parents=True)
    (root / "references").mkdir()
    (root / "SKILL.md").write_text(skill_md)
    (root / "scripts" / "report.py").write_text(SCRIPT)
    (root / "references" / "notes.md").write_text("Nothing to add.\n")
    return root


async def test_a_skill_added_by_the_cli_is_listed_read_on_demand_and_its_script_runs_in_the_jail(stack, llm, tmp_path):
    skill = make_skill(tmp_path / "env-report")
    code, out, err = await run_cli(stack, "skills", "add", str(skill), "--namespace", "team-a")
    assert code == 0, err
    assert out.startswith("stored env-report v1  Report what the sandbox sees of the environment.")
    code, out, _ = await run_cli(stack, "skills", "list", "--namespace", "team-a", "--json")
    listed = json.loads(out)
    assert [(s["name"], s["version"], s["status"]) for s in listed] == [("env-report", "1", "active")]
    assert listed[0]["paths"] == ["SKILL.md", "references/notes.md", "scripts/report.py"]

    gateway = stack.gateway_stub()
    await session_in(gateway, "skilled", "team-a")
    await session_in(gateway, "elsewhere", "team-b")
    llm.add(
        reply("", tool_call("read_skill", {"name": "env-report"})),
        reply("", tool_call("shell", {"command": "python3 skills/env-report/scripts/report.py"})),
        reply("The report ran."),
        reply("No skills here."),
    )
    events = await chat(gateway, "skilled", "report the environment")
    assert of_kind(events, "run_finished")[0].final_text == "The report ran."
    await chat(gateway, "elsewhere", "report the environment")

    first_prompt = system_of(llm.requests[0])
    assert "- env-report: Report what the sandbox sees of the environment." in first_prompt
    assert "env-report" not in system_of(llm.requests[3])  # another namespace never sees it
    results = [r.result for r in of_kind(events, "tool_result")]
    read, ran = results
    assert not read.is_error and "# Skill: env-report (version 1)" in read.output
    assert "Run `python3 skills/env-report/scripts/report.py`" in read.output
    assert "- skills/env-report/scripts/report.py" in read.output
    assert "loaded skill env-report (version 1)" in [s.message for s in of_kind(events, "status")]
    # The script ran in the session's jail: it found no credential of the services.
    assert not ran.is_error and "report: key=none cwd-ok" in ran.output, ran.output
    workspace = stack.settings.home / "workspaces" / "skilled" / "skills" / "env-report"
    assert (workspace / "references" / "notes.md").read_text() == "Nothing to add.\n"

    code, out, _ = await run_cli(stack, "skills", "show", "env-report", "--namespace", "team-a")
    assert code == 0 and "# Environment report" in out and "scripts/report.py" in out
    code, out, _ = await run_cli(stack, "skills", "remove", "env-report", "--namespace", "team-a")
    assert code == 0 and out.strip() == "removed env-report (1 versions)"
    code, out, _ = await run_cli(stack, "skills", "list", "--namespace", "team-a")
    assert out.strip() == "no skills"


async def test_versions_drafts_approval_auto_accept_and_a_restart(stack, llm, tmp_path):
    stub = user_memory_stub(stack)

    def files(description: str):
        text = SKILL_MD.replace("Report what the sandbox sees of the environment.", description)
        return [learning_pb2.SkillFile(path="SKILL.md", content=text)]

    async def put(description: str, draft: bool = False, namespace: str = "team-a"):
        return await stub.PutSkill(learning_pb2.PutSkillRequest(namespace=namespace, files=files(description),
                                                              draft=draft), timeout=10)

    async def listed(drafts: bool = False):
        reply_ = await stub.ListSkills(learning_pb2.ListSkillsRequest(namespace="team-a", include_drafts=drafts), timeout=10)
        return [(s.name, s.version, s.status, s.description) for s in reply_.skills]

    assert (await put("First.")).version == 1
    assert (await put("Second.")).version == 2
    proposed = await put("Proposed.", draft=True)
    assert (proposed.version, proposed.status) == (3, "draft")
    assert await listed() == [("env-report", 2, "active", "Second.")]
    assert await listed(drafts=True) == [("env-report", 2, "active", "Second."), ("env-report", 3, "draft", "Proposed.")]
    old = await stub.GetSkill(learning_pb2.GetSkillRequest(namespace="team-a", name="env-report", version=1), timeout=10)
    assert old.info.description == "First."

    await stack.restart()
    stub = user_memory_stub(stack)
    await stub.ListSkills(learning_pb2.ListSkillsRequest(namespace="team-a"), timeout=10, wait_for_ready=True)
    assert await listed(drafts=True) == [("env-report", 2, "active", "Second."), ("env-report", 3, "draft", "Proposed.")]
    approved = await stub.ApproveSkill(learning_pb2.SkillName(namespace="team-a", name="env-report"), timeout=10)
    assert (approved.version, approved.status) == (3, "active")
    assert await listed() == [("env-report", 3, "active", "Proposed.")]
    nothing = await rpc_error(stub.ApproveSkill(learning_pb2.SkillName(namespace="team-a", name="env-report"), timeout=10))
    assert nothing.code() == grpc.StatusCode.NOT_FOUND and "no draft to approve" in nothing.details()

    await stub.SetSkillPolicy(learning_pb2.SkillPolicy(namespace="team-a", auto_accept=True), timeout=10)
    accepted = await put("Accepted at once.", draft=True)
    assert (accepted.version, accepted.status) == (4, "active")
    # Another namespace: its own versions, its own policy.
    assert (await put("Theirs.", draft=True, namespace="team-b")).status == "draft"


async def test_a_malformed_skill_is_refused_with_a_clear_sentence_and_stores_nothing(stack, tmp_path):
    stub = user_memory_stub(stack)
    cases = {
        "no front matter": ("# just a body\n", "SKILL.md must start with YAML front matter"),
        "bad name": ("---\nname: Env Report\ndescription: x\n---\nbody\n", "is not a skill name"),
        "no description": ("---\nname: env\n---\nbody\n", "has no description"),
        "no body": ("---\nname: env\ndescription: d\n---\n", "has no body"),
    }
    for text, says in cases.values():
        err = await rpc_error(stub.PutSkill(learning_pb2.PutSkillRequest(
            namespace="team-a", files=[learning_pb2.SkillFile(path="SKILL.md", content=text)]), timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.details(), err.details()
    escape = await rpc_error(stub.PutSkill(learning_pb2.PutSkillRequest(namespace="team-a", files=[
        learning_pb2.SkillFile(path="SKILL.md", content=SKILL_MD),
        learning_pb2.SkillFile(path="scripts/../../etc/passwd", content="x")]), timeout=10))
    assert escape.code() == grpc.StatusCode.INVALID_ARGUMENT and "no '..'" in escape.details()
    assert list((await stub.ListSkills(learning_pb2.ListSkillsRequest(namespace="team-a", include_drafts=True),
                                       timeout=10)).skills) == []
    code, _, err = await run_cli(stack, "skills", "add", str(tmp_path), "--namespace", "team-a")
    assert code == 2 and "has no SKILL.md" in err


async def test_a_named_agent_sees_the_skills_it_lists_only(stack, llm, tmp_path):
    from agentmesh.v1 import agents_pb2

    stub = user_memory_stub(stack)
    for name, description in (("env-report", "Report the environment."), ("release-notes", "Write release notes.")):
        text = SKILL_MD.replace("name: env-report", f"name: {name}").replace(
            "Report what the sandbox sees of the environment.", description)
        await stub.PutSkill(learning_pb2.PutSkillRequest(
            namespace="team-a", files=[learning_pb2.SkillFile(path="SKILL.md", content=text)]), timeout=10)
    gateway = stack.gateway_stub()
    await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="team-a", spec=agents_pb2.AgentSpec(
        name="writer", instructions="You write release notes.", skills=["release-notes"])))
    await session_in(gateway, "notes", "team-a")
    llm.add(reply("", tool_call("read_skill", {"name": "env-report"})), reply("Done."), reply("Plain."))
    events = await chat(gateway, "notes", "write the notes", agent="writer")
    prompt = system_of(llm.requests[0])
    assert "- release-notes: Write release notes." in prompt and "env-report" not in prompt
    (refused,) = [r.result for r in of_kind(events, "tool_result")]
    assert refused.is_error and "agent 'writer' does not use skill 'env-report'" in refused.output
    # A turn without the agent still sees every skill of the namespace.
    await chat(gateway, "notes", "anything else")
    assert "- env-report: Report the environment." in system_of(llm.requests[-1])
