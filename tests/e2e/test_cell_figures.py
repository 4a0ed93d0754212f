"""A figure a `python` cell draws in a session sandbox, through all five services: the tool result
carries it as an image, the transcript's tool message records it (by reference, stored once), and
the next model call shows it to a model that takes images — and not to one whose catalogue entry
says `vision: false`, which reads a line of text instead."""

from __future__ import annotations

import shutil

import pytest

from tests.e2e.conftest import chat, of_kind, transcript
from tests.e2e.test_images import data_url, openai_images
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.pictures import png
from tests.support.stack import Stack
from tests.tools.test_cell_results import write_png

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")

FIGURE = png(8, 6, shade=120)


@pytest.fixture
def blind():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, blind):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"""
models:
  - name: blind
    base_url: {blind.base_url}
    model: text-only
    vision: false
""")
    env = {"AGENTMESH_MODELS": str(catalog), "AGENTMESH_SANDBOX_ISOLATION": "session"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


def draw(call_id: str) -> dict:
    return tool_call("python", {"code": write_png(".outputs/plot.png", FIGURE)}, id=call_id)


async def test_a_cells_figure_reaches_a_model_that_takes_images(stack, llm):
    llm.add(reply("", draw("c1")), reply("a grey plot"))
    events = await chat(stack.gateway_stub(), "fig", "plot it and look")
    (result,) = of_kind(events, "tool_result")
    assert not result.result.is_error, result.result.output
    assert list(result.result.data["figures"]) == [".outputs/plot.png"]
    (image,) = result.result.images
    assert image.path.startswith(".attachments/") and (image.width, image.height) == (8, 6)

    # The next model call: the tool message keeps its text, the figure follows as an image part.
    messages = llm.requests[1].body["messages"]
    tool_at = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    assert "[figures saved: .outputs/plot.png]" in messages[tool_at]["content"]
    assert openai_images(messages[tool_at + 1]) == [data_url(FIGURE)]

    # The transcript's tool message records the figure once, by reference.
    recorded = [m for m in await transcript(stack.gateway_stub(), "fig") if m.images]
    assert [m.role for m in recorded] == ["tool"]
    assert [(i.path, i.data) for i in recorded[0].images] == [(image.path, b"")]


async def test_a_text_only_model_reads_a_line_instead_of_the_figure(stack, llm, blind):
    blind.add(reply("", draw("c1")), reply("I cannot see it"))
    events = await chat(stack.gateway_stub(), "blind", "plot it", model="blind")
    (result,) = of_kind(events, "tool_result")
    assert len(result.result.images) == 1  # the result has it; this model is not shown it

    messages = blind.requests[1].body["messages"]
    assert all(openai_images(m) == [] for m in messages)
    (tool,) = [m for m in messages if m["role"] == "tool"]
    assert "[image: plot.png, 8×6 PNG — this model does not take images]" in tool["content"]
    assert llm.requests == []
