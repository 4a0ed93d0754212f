"""Images in, images out: a user's image (gRPC, HTTP, the CLI) and one a tool returns reach the
model in its own wire form — OpenAI `image_url` data URLs, Anthropic base64 image blocks — or,
for a model whose catalogue entry says `vision: false`, as a line of text; the transcript holds
each image once, by reference to its one copy in the session's workspace."""

from __future__ import annotations

import base64
from pathlib import Path

import grpc
import httpx
import pytest

from agentmesh.v1 import common_pb2, gateway_pb2, tools_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error, transcript
from tests.e2e.test_auth_and_cli import run_cli
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.pictures import png
from tests.support.stack import Stack
from tests.support.turns import collect

PICTURE = png(6, 5)


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def openai_images(message: dict) -> list[str]:
    content = message["content"]
    return [p["image_url"]["url"] for p in content if p["type"] == "image_url"] if isinstance(content, list) else []


def anthropic_images(blocks: list) -> list[tuple[str, str]]:
    found = []
    for block in blocks:
        if block["type"] == "image":
            found.append((block["source"]["media_type"], block["source"]["data"]))
        elif block["type"] == "tool_result" and isinstance(block["content"], list):
            found += anthropic_images(block["content"])
    return found


@pytest.fixture
def claude():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def blind():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, claude, blind):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"""
models:
  - name: claude
    provider: anthropic
    base_url: {claude.base_url}
    model: claude-test
  - name: blind
    base_url: {blind.base_url}
    model: text-only
    vision: false
""")
    env = {"AGENTMESH_MODELS": str(catalog), "AGENTMESH_GATEWAY_MAX_IMAGES": "2"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def tools_write(stack, session_id: str, path: str, content: bytes) -> None:
    """A file in the session's workspace, uploaded as the console does (Gateway.WriteWorkspaceFile)."""
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id), timeout=10)
    request = tools_pb2.WriteWorkspaceFileRequest(session_id=session_id, path=path, content=content)
    await gateway.WriteWorkspaceFile(request, timeout=10)


async def stored_attachments(stack, session_id: str) -> list[str]:
    folder = Path(stack.env["AGENTMESH_HOME"]) / "workspaces" / session_id / ".attachments"
    return sorted(p.name for p in folder.iterdir())


async def test_a_users_image_reaches_openai_and_anthropic_and_is_stored_once(stack, llm, claude):
    gateway = stack.gateway_stub()
    llm.add(reply("a grey square"))
    request = gateway_pb2.ChatRequest(session_id="pic", message="what is this?",
                                      images=[common_pb2.Image(data=PICTURE, name="shot.png")])
    events = await collect(gateway.Chat(request, timeout=60))
    assert of_kind(events, "run_finished")[0].final_text == "a grey square"

    (sent,) = llm.requests
    user = sent.body["messages"][-1]
    assert user["role"] == "user"
    assert user["content"] == [{"type": "text", "text": "what is this?"},
                               {"type": "image_url", "image_url": {"url": data_url(PICTURE)}}]

    # The next turn, on the Anthropic model: the stored image is read back into its image block.
    claude.add(reply("still grey"))
    await chat(gateway, "pic", "and now?", model="claude")
    (sent,) = claude.requests
    first = sent.body["messages"][0]
    assert first["role"] == "user"
    assert anthropic_images(first["content"]) == [("image/png", base64.b64encode(PICTURE).decode())]

    # Stored once: one file under .attachments/, and the transcript holds its path, never the bytes.
    messages = await transcript(gateway, "pic")
    with_images = [m for m in messages if m.images]
    assert len(with_images) == 1
    (image,) = with_images[0].images
    assert image.data == b"" and image.path.startswith(".attachments/") and image.path.endswith(".png")
    assert (image.name, image.media_type, image.width, image.height, image.size_bytes) == (
        "shot.png", "image/png", 6, 5, len(PICTURE))
    assert len(await stored_attachments(stack, "pic")) == 1


async def test_an_image_read_by_a_tool_reaches_both_protocols(stack, llm, claude):
    figure = png(3, 2, shade=200)
    await tools_write(stack, "fig", "out/figure.png", figure)
    llm.add(reply("", tool_call("read_file", {"path": "out/figure.png"}, id="c1")), reply("a plot"))
    events = await chat(stack.gateway_stub(), "fig", "draw it and look")
    (result,) = of_kind(events, "tool_result")
    assert not result.result.is_error and "figure.png, 3×2 PNG" in result.result.output
    assert result.result.images[0].path.startswith(".attachments/")

    # OpenAI: the tool message keeps its text; the image follows the tool results as a user message.
    messages = llm.requests[1].body["messages"]
    tool_at = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    assert isinstance(messages[tool_at]["content"], str)
    assert messages[tool_at + 1]["role"] == "user"
    assert openai_images(messages[tool_at + 1]) == [data_url(figure)]

    # Anthropic: the tool_result block holds the image block.
    claude.add(reply("the same plot"))
    await chat(stack.gateway_stub(), "fig", "again?", model="claude")
    blocks = [b for m in claude.requests[0].body["messages"] for b in m["content"]]
    assert anthropic_images([b for b in blocks if b["type"] == "tool_result"]) == [
        ("image/png", base64.b64encode(figure).decode())]
    # The tool's image is stored once too (the workspace file and its one copy).
    assert len(await stored_attachments(stack, "fig")) == 1
    stored = [m for m in await transcript(stack.gateway_stub(), "fig") if m.images]
    assert [m.role for m in stored] == ["tool"]


async def test_a_model_without_vision_gets_a_line_of_text(stack, llm, blind):
    listing = await stack.gateway_stub().ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
    assert {m.name: m.no_vision for m in listing.models} == {"default": False, "claude": False, "blind": True}
    blind.add(reply("I cannot see it"))
    request = gateway_pb2.ChatRequest(session_id="blind", message="look",
                                      options=gateway_pb2.ChatOptions(model="blind"),
                                      images=[common_pb2.Image(data=png(1024, 768), name="big.png")])
    await collect(stack.gateway_stub().Chat(request, timeout=60))
    user = blind.requests[0].body["messages"][-1]
    assert user["content"] == "look\n[image: big.png, 1024×768 PNG — this model does not take images]"
    assert llm.requests == []


async def test_bad_images_are_refused_before_anything_is_stored(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("hello"))
    await chat(gateway, "bad", "hi")
    before = await transcript(gateway, "bad")
    cases = [
        ([common_pb2.Image(data=b"not a picture at all")], "images[0] is not a PNG, JPEG, GIF or WebP image"),
        ([common_pb2.Image(data=PICTURE)] * 3, "images holds 3 images; at most 2 go with one message"),
        ([common_pb2.Image(data=PICTURE, path="a.png")], "images[0]: give either the image's bytes"),
        ([common_pb2.Image(data=PICTURE, media_type="image/jpeg")], "media_type says image/jpeg but the bytes are image/png"),
    ]
    for images, sentence in cases:
        err = await rpc_error(collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="bad", message="x",
                                                                           images=images), timeout=30)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert sentence in err.details()
    # A path that names no image file, or a file that is no image: refused by the agent before
    # the message is stored.
    await tools_write(stack, "bad", "notes.txt", b"just text")
    for path, sentence in [("missing.png", "images[0] (missing.png): missing.png does not exist in the workspace"),
                           ("notes.txt", "images[0] (notes.txt) is not a PNG, JPEG, GIF or WebP image")]:
        # A good image before the bad one is not stored either.
        images = [common_pb2.Image(data=PICTURE), common_pb2.Image(path=path)]
        err = await rpc_error(collect(gateway.Chat(gateway_pb2.ChatRequest(
            session_id="bad", message="x", images=images), timeout=30)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and sentence.replace("[0]", "[1]") in err.details()
    assert len(llm.requests) == 1
    assert await transcript(gateway, "bad") == before
    assert not (Path(stack.env["AGENTMESH_HOME"]) / "workspaces" / "bad" / ".attachments").exists()


async def test_an_image_by_http_and_by_the_cli(stack, llm, tmp_path):
    llm.add(reply("seen over HTTP"))
    body = {"message": "this one", "images": [{"data": base64.b64encode(PICTURE).decode(), "name": "web.png"}]}
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        answer = await http.post("/v1/sessions/web/chat", json=body)
        assert answer.status_code == 200
    assert openai_images(llm.requests[0].body["messages"][-1]) == [data_url(PICTURE)]

    picture = tmp_path / "cli.png"
    picture.write_bytes(png(2, 2, shade=9))
    llm.add(reply("seen from the CLI"))
    code, _, err = await run_cli(stack, "chat", "look", "--session", "cli", "--image", str(picture))
    assert code == 0, err
    assert openai_images(llm.requests[1].body["messages"][-1]) == [data_url(picture.read_bytes())]

    code, _, err = await run_cli(stack, "chat", "look", "--session", "cli", "--image", str(tmp_path / "nope.png"))
    assert code != 0 and "--image" in err and "nope.png" in err
