"""The learning RPCs over HTTP: a namespace's standing instructions and an on-demand reflection,
routed from their google.api.http options like every other route."""

from __future__ import annotations


async def test_standing_instructions_are_set_read_and_bounded_over_http(http):
    put = await http.put("/v1/namespaces/team-a/profile", json={"part": "soul", "text": "You answer in haiku."})
    assert put.status_code == 200, put.text
    assert put.json()["soul"] == "You answer in haiku."

    read = await http.get("/v1/namespaces/team-a/profile")
    assert read.status_code == 200
    assert read.json()["soul"] == "You answer in haiku." and read.json()["namespace"] == "team-a"
    assert (await http.get("/v1/namespaces/team-b/profile")).json()["soul"] == ""

    too_long = await http.put("/v1/namespaces/team-a/profile", json={"part": "user", "text": "z" * 4001})
    assert too_long.status_code == 400
    assert "at most 4000" in too_long.json()["error"]["message"]
    unknown = await http.put("/v1/namespaces/team-a/profile", json={"part": "mood", "text": "calm"})
    assert unknown.status_code == 400 and "soul, user, project" in unknown.json()["error"]["message"]
    assert (await http.get("/v1/namespaces/team-a/profile")).json()["user"] == ""


async def test_reflecting_on_a_session_that_does_not_exist_is_not_found_over_http(http):
    answer = await http.post("/v1/sessions/never-made/reflect", json={})
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "session 'never-made' does not exist"


SKILL_MD = """---
name: csv-stats
description: Column counts of a CSV file in the workspace.
---
Run `python3 skills/csv-stats/scripts/stats.py FILE.csv`.
"""


async def test_skills_are_added_listed_read_approved_and_removed_over_http(http):
    files = [{"path": "SKILL.md", "content": SKILL_MD}, {"path": "scripts/stats.py", "content": "print('ok')\n"}]
    added = await http.post("/v1/namespaces/team-a/skills", json={"files": files})
    assert added.status_code == 200, added.text
    # Stored on behalf of the user who called: active, not held as a draft like the agent's proposals.
    assert (added.json()["name"], added.json()["version"], added.json()["status"]) == ("csv-stats", "1", "active")
    draft = await http.post("/v1/namespaces/team-a/skills", json={"files": files, "draft": True})
    assert (draft.json()["version"], draft.json()["status"]) == ("2", "draft")

    listed = (await http.get("/v1/namespaces/team-a/skills")).json()["skills"]
    assert [(s["name"], s["version"]) for s in listed] == [("csv-stats", "1")]
    with_drafts = (await http.get("/v1/namespaces/team-a/skills", params={"include_drafts": "true"})).json()["skills"]
    assert [(s["version"], s["status"]) for s in with_drafts] == [("1", "active"), ("2", "draft")]
    assert (await http.get("/v1/namespaces/team-b/skills")).json().get("skills", []) == []

    skill = (await http.get("/v1/namespaces/team-a/skills/csv-stats")).json()
    assert skill["body"].startswith("Run `python3 skills/csv-stats/scripts/stats.py")
    assert {f["path"] for f in skill["files"]} == {"SKILL.md", "scripts/stats.py"}
    missing = await http.get("/v1/namespaces/team-b/skills/csv-stats")
    assert missing.status_code == 404

    approved = await http.post("/v1/namespaces/team-a/skills/csv-stats/approve", json={})
    assert (approved.json()["version"], approved.json()["status"]) == ("2", "active")
    policy = await http.put("/v1/namespaces/team-a/skill-policy", json={"auto_accept": True})
    assert policy.json()["auto_accept"] is True

    malformed = await http.post("/v1/namespaces/team-a/skills", json={"files": [{"path": "SKILL.md", "content": "no front matter"}]})
    assert malformed.status_code == 400 and "front matter" in malformed.json()["error"]["message"]

    removed = await http.delete("/v1/namespaces/team-a/skills/csv-stats")
    assert removed.json()["removed_versions"] == "2"
    assert (await http.get("/v1/namespaces/team-a/skills", params={"include_drafts": "true"})).json().get("skills", []) == []


async def test_promoted_tools_and_reflection_history_are_read_over_http(http):
    tools = await http.get("/v1/namespaces/team-a/promoted-tools")
    assert tools.status_code == 200 and tools.json().get("tools", []) == []
    gone = await http.delete("/v1/namespaces/team-a/promoted-tools/word_count")
    assert gone.status_code == 404
    runs = await http.get("/v1/namespaces/team-a/reflections")
    assert runs.status_code == 200 and runs.json().get("runs", []) == []
    bad = await http.get("/v1/namespaces/Team%20A/reflections")
    assert bad.status_code == 400
