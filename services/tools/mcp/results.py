"""An MCP CallToolResult as the ToolOutcome the model reads: text as text, structured content as
data (and as JSON text when there is no text), images the model is shown (PNG, JPEG, GIF, WebP:
stored once in the workspace by the result path, tools/images.py) or, of other kinds and audio,
size-capped attachments; errors as errors."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp.types as mcp_types

from agentmesh.images import ImageRef
from agentmesh.tools.images import image_of
from agentmesh.tools.results import ToolOutcome

MAX_OUTPUT_CHARS = 100_000


def to_outcome(result: mcp_types.CallToolResult, image_cap_bytes: int) -> ToolOutcome:
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    shown: list[ImageRef] = []
    attached = 0
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            texts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
            try:
                size = len(base64.b64decode(block.data, validate=True))
            except (binascii.Error, ValueError):
                texts.append(f"[{kind} {block.mime_type}: not valid base64, dropped]")
                continue
            if attached + size > image_cap_bytes:
                texts.append(f"[{kind} {block.mime_type}, {size} bytes: over the {image_cap_bytes}-byte attachment cap, dropped]")
                continue
            attached += size
            decoded = base64.b64decode(block.data) if kind == "image" else b""
            image = image_of(decoded, f"{kind} {len(shown) + 1}") if decoded else None
            if image is not None:
                # Shown to the model as an image (stored once in the workspace by core.py).
                shown.append(image)
                texts.append(image.described("shown to you as an image"))
                continue
            images.append({"kind": kind, "mime_type": block.mime_type, "base64": block.data, "bytes": size})
            texts.append(f"[{kind} {block.mime_type}, {size} bytes, attached as data.attachments[{len(images) - 1}]]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                texts.append(resource.text)
            else:
                texts.append(f"[resource {resource.uri}: binary, not shown]")
        elif isinstance(block, mcp_types.ResourceLink):
            texts.append(f"[resource link {block.uri}]")
    data: dict[str, Any] = {}
    if result.structured_content is not None:
        data["structured_content"] = result.structured_content
        if not texts:
            texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    if images:
        data["attachments"] = images
    output = "\n".join(texts)
    truncated = len(output) > MAX_OUTPUT_CHARS
    if truncated:
        output = output[:MAX_OUTPUT_CHARS] + f"\n[... cut at {MAX_OUTPUT_CHARS} characters]"
    if result.is_error:
        return ToolOutcome(output=output or "the tool reported an error", is_error=True, error_kind="tool_error",
                           data=data, truncated=truncated, images=tuple(shown))
    return ToolOutcome(output=output, data=data, truncated=truncated, images=tuple(shown))
