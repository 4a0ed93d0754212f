"""What the console's memory and skills views call, over HTTP: a namespace's long-term memories
listed, one read with its provenance and forgotten; a skill's draft rejected with its active
version kept."""

from __future__ import annotations

from google.protobuf import struct_pb2

from agentmesh.internal.v1 import memory_service_pb2


async def _remember(stack, text: str, **metadata) -> str:
    fields = struct_pb2.Struct()
    fields.update(metadata)
    record = await stack.memory_stub().Remember(memory_service_pb2.RememberRequest(
        namespace="team-a", text=text, kind="fact", metadata=fields, source_session_id="s-origin"), timeout=10)
    return record.id


async def test_memories_are_listed_read_with_provenance_and_forgotten_over_http(stack, http):
    kept = await _remember(stack, "The staging database is called ledger-stg.", origin="reflection", run="r-7")
    gone = await _remember(stack, "The user prefers metric units.")

    listed = await http.get("/v1/namespaces/team-a/memories")
    assert listed.status_code == 200, listed.text
    assert sorted(m["id"] for m in listed.json()["memories"]) == sorted([kept, gone])
    assert (await http.get("/v1/namespaces/team-b/memories")).json().get("memories", []) == []

    one = await http.get(f"/v1/namespaces/team-a/memories/{kept}")
    assert one.status_code == 200, one.text
    body = one.json()
    assert (body["text"], body["kind"], body["source_session_id"]) == \
        ("The staging database is called ledger-stg.", "fact", "s-origin")
    assert body["metadata"]["origin"] == "reflection" and body["metadata"]["run"] == "r-7"

    forgotten = await http.delete(f"/v1/namespaces/team-a/memories/{gone}")
    assert forgotten.status_code == 200 and forgotten.json()["forgotten"] == "1"
    assert [m["id"] for m in (await http.get("/v1/namespaces/team-a/memories")).json()["memories"]] == [kept]
    again = await http.delete(f"/v1/namespaces/team-a/memories/{gone}")
    assert again.status_code == 404
    # Another namespace's id is not reachable through this one.
    assert (await http.delete(f"/v1/namespaces/team-b/memories/{kept}")).status_code == 404
    too_big = await http.get("/v1/namespaces/team-a/memories", params={"page_size": 1000})
    assert too_big.status_code == 400 and "page_size" in too_big.json()["error"]["message"]


SKILL_MD = """---
name: csv-stats
description: Column counts of a CSV file in the workspace.
---
Run `python3 skills/csv-stats/scripts/stats.py FILE.csv`.
"""


async def test_a_skills_draft_is_rejected_and_its_active_version_kept_over_http(http):
    files = [{"path": "SKILL.md", "content": SKILL_MD}]
    assert (await http.post("/v1/namespaces/team-a/skills", json={"files": files})).status_code == 200
    draft = await http.post("/v1/namespaces/team-a/skills", json={"files": files + [
        {"path": "scripts/stats.py", "content": "print('v2')\n"}], "draft": True})
    assert draft.json()["status"] == "draft"

    rejected = await http.post("/v1/namespaces/team-a/skills/csv-stats/reject", json={})
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["removed_versions"] == "1"
    listed = (await http.get("/v1/namespaces/team-a/skills", params={"include_drafts": "true"})).json()["skills"]
    assert [(s["name"], s["version"], s["status"]) for s in listed] == [("csv-stats", "1", "active")]
    assert (await http.get("/v1/namespaces/team-a/skills/csv-stats", params={"version": 2})).status_code == 404

    # The rejected draft's number is not given again.
    again = await http.post("/v1/namespaces/team-a/skills", json={"files": files, "draft": True})
    assert again.json()["version"] == "3"
    assert (await http.post("/v1/namespaces/team-a/skills/csv-stats/reject", json={})).status_code == 200
    nothing_waits = await http.post("/v1/namespaces/team-a/skills/csv-stats/reject", json={})
    assert nothing_waits.status_code == 404
    assert "no draft to reject" in nothing_waits.json()["error"]["message"]
    # A skill that was only ever a draft goes entirely.
    await http.post("/v1/namespaces/team-a/skills", json={"files": [{"path": "SKILL.md", "content": SKILL_MD.replace(
        "csv-stats", "tsv-stats")}], "draft": True})
    assert (await http.post("/v1/namespaces/team-a/skills/tsv-stats/reject", json={})).status_code == 200
    assert (await http.get("/v1/namespaces/team-a/skills/tsv-stats")).status_code == 404
