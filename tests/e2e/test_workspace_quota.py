"""The workspace quota seen from a client: a turn whose tool call fills the workspace gets a
`disk_quota` tool result, and the model reads the sentence that names the quota and the usage."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import chat, of_kind
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack

FILL = "for i in 1 2 3 4 5 6 7 8; do head -c 30M /dev/zero > f$i || exit 1; done; echo all-written"


@pytest.fixture
async def small_quota_stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB": "32"}) as running:
        yield running


async def test_a_full_workspace_reaches_the_client_and_the_model_as_disk_quota(small_quota_stack, llm):
    llm.add(reply("", tool_call("shell", {"command": FILL})), reply("The workspace is full."))
    events = await chat(small_quota_stack.gateway_stub(), "fill", "write eight big files")

    results = [event.result for event in of_kind(events, "tool_result")]
    assert len(results) == 1 and results[0].is_error and results[0].error_kind == "disk_quota", results
    assert "32.0 MiB disk quota" in results[0].output and "all-written" not in results[0].output
    tool_messages = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert "32.0 MiB disk quota" in tool_messages[0]["content"]
    assert of_kind(events, "run_finished")[0].final_text == "The workspace is full."
