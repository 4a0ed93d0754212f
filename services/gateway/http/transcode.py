"""HTTP request <-> protobuf message, with protobuf's own JSON mapping (json_format).

A request message is built from the path variables, then the JSON body (routes with body "*")
or the query string (the others). Anything that does not fit the message — an unknown field, a
wrong type, a body that is not a JSON object — is refused with a sentence naming it, before any
RPC is made. Responses use the proto field names (`session_id`, not `sessionId`) and print
fields left at their defaults, so clients see every field.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from agentmesh import error_reasons
from agentmesh.errors import InvalidArgument
from agentmesh.gateway.http.routes import Route, is_repeated

_INTEGER_TYPES = {
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
}
_FLOAT_TYPES = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def to_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def build_request(route: Route, path_values: Mapping[str, str], query: Mapping[str, list[str]], body: bytes) -> Message:
    fields: dict[str, Any] = {}
    fields = _body_object(body) if route.body else _query_fields(route, query)
    for name in route.path_fields:
        given = fields.get(name)
        if given not in (None, "", path_values[name]):
            raise InvalidArgument(f"{name} is {path_values[name]!r} in the path but {given!r} in the body; leave it out of the body", field=name)
        fields[name] = path_values[name]
    _refuse_unknown(route, fields)
    message = route.request_type()
    try:
        json_format.ParseDict(fields, message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"the request does not fit {route.request_type.DESCRIPTOR.name}: {_plain(str(exc))}",
                              reason=error_reasons.MALFORMED_REQUEST) from None
    return message


def _refuse_unknown(route: Route, fields: Mapping[str, Any]) -> None:
    descriptor = route.request_type.DESCRIPTOR
    known = {f.name for f in descriptor.fields} | {f.json_name for f in descriptor.fields}
    for name in fields:
        if name not in known:
            names = ", ".join(f.name for f in descriptor.fields if f.name not in route.path_fields)
            raise InvalidArgument(f"unknown field {name[:64]!r} in the request; {route.rpc} takes: {names}", field=name[:64])


def _body_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body, parse_constant=_not_json)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise InvalidArgument(f"the request body is not valid JSON{where}: send a JSON object",
                              reason=error_reasons.MALFORMED_REQUEST) from None
    except RecursionError:
        # Python's parser recurses per level: a body of 100,000 brackets would otherwise be a 500.
        raise InvalidArgument("the request body nests too deeply to parse: send a flatter JSON object",
                              reason=error_reasons.MALFORMED_REQUEST) from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"the request body must be a JSON object, not {type(value).__name__}",
                              reason=error_reasons.MALFORMED_REQUEST)
    return value


def _not_json(literal: str) -> Any:
    # Python reads NaN and Infinity; JSON has neither, and no bound holds NaN back.
    raise InvalidArgument(f"the request body is not valid JSON: {literal} is not a JSON number")


def _query_fields(route: Route, query: Mapping[str, list[str]]) -> dict[str, Any]:
    descriptor = route.request_type.DESCRIPTOR
    allowed = route.query_fields
    fields: dict[str, Any] = {}
    for name, values in query.items():
        if name not in allowed:
            known = ", ".join(allowed) or "none"
            raise InvalidArgument(f"unknown query parameter {name!r}; this route takes: {known}", field=name[:64])
        field = descriptor.fields_by_name[name]
        converted = [_scalar(name, field, value) for value in values]
        if is_repeated(field):
            fields[name] = converted
        elif len(converted) > 1:
            raise InvalidArgument(f"query parameter {name!r} is given {len(converted)} times; give it once", field=name)
        else:
            fields[name] = converted[0]
    return fields


def _scalar(name: str, field: Any, text: str) -> Any:
    if field.type == FieldDescriptor.TYPE_BOOL:
        if text.lower() in ("true", "1", ""):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise InvalidArgument(f"query parameter {name!r} must be true or false, got {text!r}", field=name)
    if field.type in _INTEGER_TYPES:
        try:
            return int(text)
        except ValueError:
            raise InvalidArgument(f"query parameter {name!r} must be a whole number, got {text!r}", field=name) from None
    if field.type in _FLOAT_TYPES:
        try:
            number = float(text)
        except ValueError:
            raise InvalidArgument(f"query parameter {name!r} must be a number, got {text[:64]!r}", field=name) from None
        if not math.isfinite(number):
            raise InvalidArgument(f"query parameter {name!r} must be a finite number, got {text[:64]!r}", field=name)
        return number
    return text


def _plain(message: str) -> str:
    # json_format names the message type with its package and lists camelCase names; people
    # know the route and the proto names.
    return message.replace("agentmesh.v1.", "").split("\n Available Fields")[0].strip()
