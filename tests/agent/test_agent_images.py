"""Images, in the parts that are plain Python: reading an image's kind and size from its bytes,
the line that describes one, a request's images read back or described (loop/images.py), and
the providers' wire forms sent to a real (scripted) model server."""

from __future__ import annotations

import base64
import struct

import httpx
import pytest

from agentmesh.agent.capabilities.compaction import render
from agentmesh.agent.loop.images import ImageReads, with_images
from agentmesh.agent.providers import AnthropicProvider, OpenAIProvider, RetryPolicy
from agentmesh.agent.providers.openai import openai_body
from agentmesh.agent.types import ChatMessage, ImageRef, ModelRequest, ToolCall
from agentmesh.errors import NotFound
from agentmesh.images import attachment_path, describe, image_info
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.llm_wire import protocol_errors
from tests.support.pictures import png

FAST = RetryPolicy(max_retries=0)


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def test_kind_and_size_are_read_from_the_bytes():
    assert image_info(png(640, 480)) == ("image/png", 640, 480)
    assert image_info(jpeg(1024, 768)) == ("image/jpeg", 1024, 768)
    assert image_info(b"GIF89a" + struct.pack("<HH", 32, 16) + b"\x00" * 8) == ("image/gif", 32, 16)
    webp = b"RIFF" + b"\x00" * 4 + b"WEBPVP8X" + b"\x00" * 8 + (99).to_bytes(3, "little") + (49).to_bytes(3, "little")
    assert image_info(webp) == ("image/webp", 100, 50)
    assert image_info(b"%PDF-1.7 not an image") == ("", 0, 0)
    # The same bytes, the same stored name; other bytes, another.
    assert attachment_path(png(), "image/png") == attachment_path(png(), "image/png") != attachment_path(png(shade=1), "image/png")


def test_an_image_is_described_in_one_line():
    shot = ImageRef(path=".attachments/ab.png", media_type="image/png", name="shot.png", width=1024, height=768)
    assert describe(shot, "this model does not take images") == (
        "[image: shot.png, 1024×768 PNG — this model does not take images]")
    assert describe(ImageRef(path=".attachments/cd.jpg", media_type="image/jpeg")) == "[image: cd.jpg, JPEG]"
    # Compaction reads it as text rather than losing it.
    said = render(ChatMessage(role="user", content="look", images=(shot,)))
    assert said == "[user]\nlook\n[image: shot.png, 1024×768 PNG]"


class Files:
    """The workspace's stored images, as the tools service keeps them."""

    def __init__(self, stored: dict[str, bytes]):
        self.stored = stored
        self.reads: list[str] = []

    async def write(self, session_id: str, path: str, data: bytes) -> None:
        self.stored[path] = data

    async def read(self, session_id: str, path: str, max_bytes: int) -> bytes:
        self.reads.append(path)
        if path not in self.stored:
            raise NotFound(f"{path} does not exist in the workspace")
        return self.stored[path]


async def test_a_request_gets_the_bytes_once_per_turn_or_a_line_of_text():
    picture = png(3, 3)
    here = ImageRef(path=attachment_path(picture, "image/png"), media_type="image/png", name="a.png", width=3, height=3)
    gone = ImageRef(path=".attachments/gone.png", media_type="image/png", name="gone.png")
    files = Files({here.path: picture})
    reads = ImageReads(files, "s", 1024)
    request = ModelRequest(model="m", tools=[], messages=[ChatMessage(role="user", content="see", images=(here, gone))])

    for _ in range(2):
        sent = await with_images(request, True, reads)
        (message,) = sent.messages
        assert [i.data for i in message.images] == [picture]
        assert message.content == ("see\n[image: gone.png, PNG — could not be read back "
                                   "(.attachments/gone.png does not exist in the workspace)]")
    assert files.reads == [here.path, gone.path]  # read once for the whole turn
    assert request.messages[0].images == (here, gone)  # the stored message keeps its references

    # Past the per-request bound the older images are a line: the newest stay pixels.
    older = ChatMessage(role="user", content="first", images=(here,))
    both = ModelRequest(model="m", tools=[], messages=[older, ChatMessage(role="user", content="then", images=(here,))])
    bounded = await with_images(both, True, reads, max_images=1)
    assert bounded.messages[0].images == () and bounded.messages[1].images[0].data == picture
    assert bounded.messages[0].content == "first\n[image: a.png, 3×3 PNG — shown earlier; not sent again]"

    blind = await with_images(request, False, reads)
    assert blind.messages[0].images == ()
    assert blind.messages[0].content.splitlines()[1] == "[image: a.png, 3×3 PNG — this model does not take images]"


@pytest.fixture
async def http():
    async with httpx.AsyncClient() as client:
        yield client


def tool_turn(picture: bytes) -> ModelRequest:
    image = ImageRef(path=".attachments/x.png", media_type="image/png", name="x.png", data=picture)
    return ModelRequest(model="m", tools=[], messages=[
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="draw two", images=(image,)),
        ChatMessage(role="assistant", tool_calls=(ToolCall("c1", "read_file", '{"path": "a.png"}'),
                                                  ToolCall("c2", "read_file", '{"path": "b.png"}'))),
        ChatMessage(role="tool", content="[image: a.png]", tool_call_id="c1", name="read_file", images=(image,)),
        ChatMessage(role="tool", content="plain text", tool_call_id="c2", name="read_file"),
    ])


async def test_openai_sends_data_urls_and_a_tools_images_after_the_tool_messages(http):
    picture = png(2, 2)
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    with ScriptedLLMServer([reply("ok")], check_protocol=True) as llm:
        provider = OpenAIProvider(http, llm.base_url, "sk-test", FAST)
        [item async for item in provider.stream(tool_turn(picture))]
    messages = llm.requests[0].body["messages"]
    assert protocol_errors(messages) == []
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert messages[1]["content"] == [{"type": "text", "text": "draw two"},
                                      {"type": "image_url", "image_url": {"url": url}}]
    assert messages[5]["content"] == [{"type": "text", "text": "Images returned by read_file (c1):"},
                                      {"type": "image_url", "image_url": {"url": url}}]


async def test_openai_sends_a_tool_runs_images_right_after_that_run_when_the_history_goes_on(http):
    # Two runs of tool results, each followed by more messages: each run's images follow it, before
    # the next message; the body sent is openai_body's, the runs without images sending none.
    picture = png(2, 2)
    earlier = tool_turn(picture).messages
    plain = [ChatMessage(role="assistant", tool_calls=(ToolCall("c3", "shell", "{}"),)),
             ChatMessage(role="tool", content="ok", tool_call_id="c3", name="shell")]
    request = ModelRequest(model="m", tools=[], messages=[
        *earlier, ChatMessage(role="assistant", content="seen"), *plain, *earlier[1:],
        ChatMessage(role="user", content="again")])
    with ScriptedLLMServer([reply("ok")], check_protocol=True) as llm:
        provider = OpenAIProvider(http, llm.base_url, "sk-test", FAST)
        [item async for item in provider.stream(request)]
    body = llm.requests[0].body
    assert protocol_errors(body["messages"]) == []
    assert body == openai_body(request)
    assert [m["role"] for m in body["messages"]] == [
        "system", "user", "assistant", "tool", "tool", "user", "assistant", "assistant", "tool",
        "user", "assistant", "tool", "tool", "user", "user"]
    shown = {"type": "text", "text": "Images returned by read_file (c1):"}
    assert body["messages"][5]["content"][0] == shown == body["messages"][13]["content"][0]


async def test_anthropic_sends_base64_image_blocks_in_the_message_and_the_tool_result(http):
    picture = png(2, 2)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(picture).decode()}}
    with ScriptedLLMServer([reply("ok")]) as llm:
        provider = AnthropicProvider(http, llm.base_url, "sk-test", FAST)
        [item async for item in provider.stream(tool_turn(picture))]
    messages = llm.requests[0].body["messages"]
    assert messages[0]["content"] == [{"type": "text", "text": "draw two"}, block]
    results = messages[2]["content"]
    assert results[0] == {"type": "tool_result", "tool_use_id": "c1",
                          "content": [{"type": "text", "text": "[image: a.png]"}, block]}
    assert results[1] == {"type": "tool_result", "tool_use_id": "c2", "content": "plain text"}
