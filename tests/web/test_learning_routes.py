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
