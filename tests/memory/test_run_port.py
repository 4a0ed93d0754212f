"""Conformance suite for the run port (agentmesh.memory.ports.RunStore, runs.DocumentRuns over the
document port), run against each document adapter (edge, server: as test_document_port.py), and
the runs core's checks of what a gateway sends."""

from __future__ import annotations

import pytest

from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.runs import DocumentRuns, Runs
from agentmesh.memory.stores import open_documents


@pytest.fixture(params=["edge", "server"])
async def runs_factory(request, tmp_path):
    opened = []

    async def open_runs():
        home = tmp_path / "home"
        store = EdgeStore(home) if request.param == "edge" else QdrantStore.connect(path=home / "qdrant")
        await store.open()
        opened.append(store)
        return store, DocumentRuns(await open_documents(store))

    async def reopen(store):
        await store.close()
        opened.remove(store)
        return await open_runs()

    open_runs.reopen = reopen
    yield open_runs
    for store in opened:
        await store.close()


def run(run_id, session_id="s1", namespace="team-a", state="running", created_at=1000.0, **more):
    return {"run_id": run_id, "session_id": session_id, "namespace": namespace, "state": state,
            "created_at": created_at, **more}


async def test_a_run_is_put_read_by_id_replaced_and_survives_a_reopen(runs_factory):
    store, runs = await runs_factory()
    assert await runs.get_run("run-1") is None
    await runs.put_run(run("run-1"))
    assert await runs.get_run("run-1") == run("run-1")
    finished = run("run-1", state="succeeded", usage={"total_tokens": "12"}, stop_reason="completed")
    await runs.put_run(finished)
    assert await runs.get_run("run-1") == finished

    _, runs = await runs_factory.reopen(store)
    assert await runs.get_run("run-1") == finished
    assert await runs.list_runs("team-a") == [finished]


async def test_a_run_that_moves_namespace_is_listed_in_its_new_one_only(runs_factory):
    _, runs = await runs_factory()
    await runs.put_run(run("run-m", namespace="default"))
    await runs.put_run(run("run-m", namespace="team-a", state="succeeded"))
    assert await runs.list_runs("default") == []
    assert [r["state"] for r in await runs.list_runs("team-a")] == ["succeeded"]
    assert (await runs.get_run("run-m"))["namespace"] == "team-a"


async def test_runs_are_listed_per_namespace_and_session_newest_first(runs_factory):
    _, runs = await runs_factory()
    await runs.put_run(run("run-a", created_at=1000.0))
    await runs.put_run(run("run-b", session_id="s2", created_at=2000.0))
    await runs.put_run(run("run-c", created_at=3000.0))
    await runs.put_run(run("run-x", namespace="team-b", created_at=4000.0))

    assert [r["run_id"] for r in await runs.list_runs("team-a")] == ["run-c", "run-b", "run-a"]
    assert [r["run_id"] for r in await runs.list_runs("team-a", "s1")] == ["run-c", "run-a"]
    assert [r["run_id"] for r in await runs.list_runs("team-b")] == ["run-x"]
    assert await runs.list_runs("team-c") == []


async def test_runs_with_a_pending_webhook_are_listed_across_namespaces_until_delivered(runs_factory):
    store, runs = await runs_factory()
    hook = {"webhook_url": "https://example.com/hook"}
    await runs.put_run(run("run-a", state="succeeded", webhook_state="pending", **hook))
    await runs.put_run(run("run-b", namespace="team-b", state="failed", webhook_state="pending", **hook))
    await runs.put_run(run("run-c", state="succeeded"))
    assert sorted(r["run_id"] for r in await runs.pending_webhooks()) == ["run-a", "run-b"]

    await runs.put_run(run("run-a", state="succeeded", webhook_state="delivered", **hook))
    _, runs = await runs_factory.reopen(store)
    assert [r["run_id"] for r in await runs.pending_webhooks()] == ["run-b"]


async def test_the_core_filters_by_state_and_time_and_pages(runs_factory):
    _, store = await runs_factory()
    core = Runs(store)
    for i in range(5):
        await core.put(run(f"run-{i}", state="succeeded" if i % 2 else "failed", created_at=1000.0 + i))

    page, token = await core.list("team-a", "", ["succeeded"], 0, 0, 1, "")
    assert [r["run_id"] for r in page] == ["run-3"] and token
    page, token = await core.list("team-a", "", ["succeeded"], 0, 0, 1, token)
    assert [r["run_id"] for r in page] == ["run-1"] and token == ""
    page, _ = await core.list("team-a", "s1", [], 1001.0, 1003.0, 0, "")
    assert [r["run_id"] for r in page] == ["run-2", "run-1"]


async def test_bad_input_is_refused_with_a_sentence_and_changes_nothing(runs_factory):
    _, store = await runs_factory()
    core = Runs(store)
    with pytest.raises(InvalidArgument, match="state 'done' is not one of queued, running"):
        await core.put(run("run-1", state="done"))
    with pytest.raises(InvalidArgument, match="run_id"):
        await core.put(run("bad id!"))
    with pytest.raises(InvalidArgument, match="state 'done'"):
        await core.list("team-a", "", ["done"], 0, 0, 0, "")
    with pytest.raises(InvalidArgument, match="page_token"):
        await core.list("team-a", "", [], 0, 0, 0, "zz")
    with pytest.raises(NotFound, match="there is no run 'run-1'"):
        await core.get("run-1")
    assert await store.list_runs("team-a") == []
