"""`agentmesh.v1` messages <-> the shared plain types: the one module that knows both.

Services convert their own core types at their edges (`agent/server.py` for run events,
`memory/convert.py` for memory records); what more than one service sends or receives — tool
specs, tool results, JSON objects in `google.protobuf.Struct` — is converted here, once.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format, struct_pb2

from agentmesh.images import ImageRef
from agentmesh.tooling import ToolOutcome, ToolSpec
from agentmesh.v1 import common_pb2, tools_pb2

__all__ = [
    "dict_from_struct",
    "image_from_proto",
    "image_to_proto",
    "struct_from_dict",
    "tool_result_from_proto",
    "tool_result_to_proto",
    "tool_spec_from_proto",
    "tool_spec_to_proto",
]

# The schema a tool without a usable one is offered with: an object, any properties.
_ANY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def struct_from_dict(value: dict[str, Any] | None) -> struct_pb2.Struct:
    """A JSON object as a Struct; values JSON cannot hold are sent as their text."""
    struct = struct_pb2.Struct()
    if value:
        struct.update(json.loads(json.dumps(value, default=str)))
    return struct


def dict_from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(struct)


def tool_spec_to_proto(spec: ToolSpec) -> tools_pb2.ToolSpec:
    return tools_pb2.ToolSpec(
        name=spec.name, description=spec.description, parameters_json_schema=spec.schema_json, runs_code=spec.runs_code,
        read_only=spec.read_only,
    )


def tool_spec_from_proto(spec: tools_pb2.ToolSpec) -> ToolSpec:
    """A catalog entry; a missing or unreadable schema becomes "an object, any properties"."""
    try:
        parameters = json.loads(spec.parameters_json_schema or "{}")
    except json.JSONDecodeError:
        parameters = {}
    if not isinstance(parameters, dict) or not parameters:
        parameters = dict(_ANY_OBJECT)
    return ToolSpec(name=spec.name, description=spec.description, parameters=parameters, runs_code=spec.runs_code,
                    read_only=spec.read_only)


def tool_result_to_proto(outcome: ToolOutcome) -> common_pb2.ToolResult:
    result = common_pb2.ToolResult(
        call_id=outcome.call_id,
        name=outcome.name,
        output=outcome.output,
        is_error=outcome.is_error,
        exit_code=outcome.exit_code,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        truncated=outcome.truncated,
        duration_ms=outcome.duration_ms,
        error_kind=outcome.error_kind,
    )
    if outcome.data:
        result.data.CopyFrom(struct_from_dict(outcome.data))
    result.images.extend(image_to_proto(i) for i in outcome.images)
    return result


def image_to_proto(image: ImageRef) -> common_pb2.Image:
    """A stored image's reference; its bytes never go with it (they are read when needed)."""
    return common_pb2.Image(path=image.path, media_type=image.media_type, name=image.name, width=image.width,
                            height=image.height, size_bytes=image.size_bytes)


def image_from_proto(image: common_pb2.Image) -> ImageRef:
    return ImageRef(path=image.path, media_type=image.media_type, name=image.name, width=image.width,
                    height=image.height, size_bytes=image.size_bytes)


def tool_result_from_proto(result: common_pb2.ToolResult) -> ToolOutcome:
    return ToolOutcome(
        call_id=result.call_id,
        name=result.name,
        output=result.output,
        is_error=result.is_error,
        error_kind=result.error_kind,
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        truncated=result.truncated,
        duration_ms=result.duration_ms,
        data=dict_from_struct(result.data) if result.HasField("data") else {},
        images=tuple(image_from_proto(i) for i in result.images),
    )
