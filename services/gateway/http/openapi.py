"""The OpenAPI 3.1 document of the HTTP API, generated from the same route table the server
uses, with JSON Schemas derived from the protobuf messages (proto field names, json_format's
mapping: 64-bit integers as strings, bytes as base64, Struct as any object)."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from agentmesh.gateway.http.errors import HTTP_STATUS
from agentmesh.gateway.http.routes import Route, is_repeated
from agentmesh.gateway.http.sse import EVENT_ID_PATTERN
from agentmesh.ids import ID_PATTERN, NAMESPACE_PATTERN
from agentmesh.v1 import common_pb2

_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "int32"},
    # json_format writes 64-bit integers as strings and reads either.
    FieldDescriptor.TYPE_INT64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_SINT64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": ["string", "integer"], "format": "int64"},
}
# Fields whose values the gateway checks against a pattern (agentmesh.ids); in a body they may
# also be left empty (the default: a new id, the caller's namespace).
_PATTERNS = {"session_id": ID_PATTERN, "job_id": ID_PATTERN, "namespace": NAMESPACE_PATTERN}
_WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Struct": {"type": "object", "additionalProperties": True},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
}
_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "enum": sorted(HTTP_STATUS)},
                "message": {"type": "string"},
                "http_status": {"type": "integer"},
            },
            "required": ["code", "message", "http_status"],
        }
    },
    "required": ["error"],
}


def openapi_document(routes: list[Route], version: str) -> dict[str, Any]:
    schemas: dict[str, Any] = {"Error": _ERROR}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.http_method.lower()] = _operation(route, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agentmesh gateway",
            "version": version,
            "description": "The Gateway gRPC API over HTTP/JSON; chat streams Server-Sent Events. See docs/api.md.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _operation(route: Route, schemas: dict[str, Any]) -> dict[str, Any]:
    request = route.request_type.DESCRIPTOR
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True,
         "schema": {**_field_schema(request.fields_by_name[name], schemas),
                    **({"pattern": _PATTERNS[name]} if name in _PATTERNS else {})}}
        for name in route.path_fields
    ]
    parameters += [
        {"name": name, "in": "query", "required": False, "schema": _field_schema(request.fields_by_name[name], schemas)}
        for name in route.query_fields
    ]
    response = _ref(route.response_type.DESCRIPTOR, schemas)
    operation: dict[str, Any] = {
        "operationId": route.name,
        "summary": f"{route.service}.{route.rpc}",
        "parameters": parameters,
        "responses": {
            "default": {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
        },
    }
    if route.streaming:
        operation["responses"]["200"] = _event_stream(route, response, schemas)
        if route.rpc == "Chat":
            parameters.append({
                "name": "Last-Event-ID", "in": "header", "required": False,
                "schema": {"type": "string", "pattern": EVENT_ID_PATTERN},
                "description": "Resume a dropped stream after this event instead of starting a turn: the id of "
                               "the last event received, 'B.N' or 'P' (docs/api.md).",
            })
    else:
        operation["responses"]["200"] = {"description": "OK", "content": {"application/json": {"schema": response}}}
    if route.body:
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": _ref(request, schemas, omit=route.path_fields)}},
        }
    return operation


def _event_stream(route: Route, item: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """A stream's 200: one SSE message per message of the RPC's stream, as the server writes them
    (`id:` only on a chat's, `event:` the payload's name, `data:` one line of JSON)."""
    descriptor = route.response_type.DESCRIPTOR
    payload = descriptor.oneofs_by_name.get("payload")
    kinds = [field.name for field in payload.fields] if payload is not None else ["message"]
    data: list[dict[str, Any]] = [item, {"$ref": "#/components/schemas/Error"}]
    properties: dict[str, Any] = {}
    description = (f"Server-Sent Events: one message per {descriptor.name}, `event:` its payload's name and "
                   f"`data:` the {descriptor.name} as JSON; a failure once the stream has begun is an `error` "
                   "message whose data is the Error object. Comment lines (': keep-alive') come on a quiet stream.")
    if route.rpc == "Chat":
        kinds.append("message")  # a resumed stream's transcript entries
        data.insert(1, _ref(common_pb2.Message.DESCRIPTOR, schemas))
        properties["id"] = {
            "type": "string", "pattern": EVENT_ID_PATTERN,
            "description": "'B.N' for a running turn's Nth event (B: the transcript position it began at), 'P' "
                           "(the position after the turn) on its last, a transcript entry's seq on a `message`; "
                           "send it back as Last-Event-ID to resume",
        }
        description += " A resumed stream (Last-Event-ID) first replays the transcript as `message` messages."
    properties["event"] = {"type": "string", "enum": sorted({*kinds, "error"})}
    properties["data"] = {"oneOf": data}
    return {
        "description": description,
        "content": {"text/event-stream": {"itemSchema": {
            "type": "object", "properties": properties, "required": ["event", "data"]}}},
    }


def _ref(descriptor: Any, schemas: dict[str, Any], omit: tuple[str, ...] = ()) -> dict[str, Any]:
    if descriptor.full_name in _WELL_KNOWN:
        return dict(_WELL_KNOWN[descriptor.full_name])
    name = descriptor.name + ("Body" if omit else "")
    if name not in schemas:
        schemas[name] = {}  # placeholder first: messages may refer to themselves
        properties: dict[str, Any] = {}
        for field in descriptor.fields:
            if field.name in omit:
                continue
            properties[field.name] = _field_schema(field, schemas)
            if field.name in _PATTERNS and properties[field.name] == {"type": "string"}:
                properties[field.name]["pattern"] = _PATTERNS[field.name].replace("^", "^(?:", 1)[:-1] + ")?$"
        schemas[name] = {"type": "object", "properties": properties, "additionalProperties": False}
    return {"$ref": f"#/components/schemas/{name}"}


def _field_schema(field: Any, schemas: dict[str, Any]) -> dict[str, Any]:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        return {"type": "object", "additionalProperties": _field_schema(message.fields_by_name["value"], schemas)}
    if message is not None:
        single = _ref(message, schemas)
    elif field.type == FieldDescriptor.TYPE_ENUM:
        single = {"type": "string", "enum": [v.name for v in field.enum_type.values]}
    else:
        single = dict(_SCALARS.get(field.type, {"type": "string"}))
    if is_repeated(field):
        return {"type": "array", "items": single}
    return single
