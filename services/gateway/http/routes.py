"""The HTTP routes of the public API, read from the protos at start-up.

Each Gateway and Scheduler RPC carries a `google.api.http` option (gateway.proto, scheduler.proto) naming its HTTP method,
path template and body. This module turns those options into `Route`s; the server, the
transcoder and the OpenAPI document all work from that one table, so a route is declared once,
beside its RPC. An RPC without the option is still served, at `POST /v1/rpc/<Method>` with the
request as the body, so no public RPC is left out of the HTTP API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from google.api import annotations_pb2
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

_TEMPLATE_VARIABLE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_PATTERNS = ("get", "put", "post", "delete", "patch")


@dataclass(frozen=True)
class Route:
    service: str               # the gRPC service that answers it: "Gateway" or "Scheduler"
    rpc: str                   # its method, e.g. "CreateSession"
    http_method: str           # "GET", "POST", ...
    path: str                  # the template, e.g. "/v1/sessions/{session_id}"
    body: str                  # "*" (the whole request), "" (none: query parameters)
    path_fields: tuple[str, ...]
    request_type: type[Message]
    response_type: type[Message]
    streaming: bool            # server streaming: served as Server-Sent Events

    @property
    def name(self) -> str:
        """Unique across the services served: the rpc's name, qualified by its service when the
        Gateway has a method of that name too (the Scheduler's ListRuns, the Gateway's ListRuns)."""
        if self.service == "Gateway" or self.rpc not in _gateway_methods():
            return self.rpc
        return f"{self.service}.{self.rpc}"

    @property
    def query_fields(self) -> tuple[str, ...]:
        """Top-level request fields a GET/DELETE takes from the query string."""
        if self.body:
            return ()
        return tuple(
            f.name for f in self.request_type.DESCRIPTOR.fields
            if f.name not in self.path_fields and f.message_type is None
        )


def _gateway_methods() -> frozenset[str]:
    from agentmesh.v1 import gateway_pb2

    return frozenset(m.name for m in gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].methods)


def is_repeated(field: Any) -> bool:
    # protobuf 6.31+ has `is_repeated`; `label` went away in 7.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def routes_of(service: ServiceDescriptor) -> list[Route]:
    return [_route(service.name, method) for method in service.methods]


def _route(service: str, method: MethodDescriptor) -> Route:
    rule = method.GetOptions().Extensions[annotations_pb2.http]
    pattern = rule.WhichOneof("pattern")
    if pattern in _PATTERNS:
        http_method, path, body = pattern.upper(), getattr(rule, pattern), rule.body
    else:
        http_method, path, body = "POST", f"/v1/rpc/{method.name}", "*"
    if body not in ("", "*"):
        raise ValueError(f"{method.full_name}: only body \"*\" or no body is supported, got {body!r}")
    request_type = GetMessageClass(method.input_type)
    fields = tuple(_TEMPLATE_VARIABLE.findall(path))
    for name in fields:
        if name not in request_type.DESCRIPTOR.fields_by_name:
            raise ValueError(f"{method.full_name}: path variable {{{name}}} is not a field of {method.input_type.name}")
    return Route(
        service=service,
        rpc=method.name,
        http_method=http_method,
        path=path,
        body=body,
        path_fields=fields,
        request_type=request_type,
        response_type=GetMessageClass(method.output_type),
        streaming=method.server_streaming,
    )
