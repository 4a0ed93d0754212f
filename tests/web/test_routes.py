"""The route table read from the protos' google.api.http options."""

from __future__ import annotations

from agentmesh.gateway.http.routes import routes_of
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.v1 import gateway_pb2


def test_routes_come_from_the_http_options_of_gateway_proto():
    routes = {r.rpc: r for r in routes_of(gateway_pb2.DESCRIPTOR.services_by_name["Gateway"])}
    approve = routes["Approve"]
    assert (approve.http_method, approve.path, approve.body) == ("POST", "/v1/sessions/{session_id}/approvals/{call_id}", "*")
    assert approve.path_fields == ("session_id", "call_id") and approve.request_type is gateway_pb2.ApproveRequest
    assert routes["Chat"].streaming and not routes["GetSession"].streaming
    assert routes["ListSessions"].query_fields == ("page_size", "page_token")
    assert routes["ReadWorkspaceFile"].query_fields == ("path", "max_bytes")


def test_an_rpc_without_an_http_option_is_still_served():
    # The Tools service carries no options: every RPC gets POST /v1/rpc/<Method> with a JSON body.
    routes = routes_of(tools_service_pb2.DESCRIPTOR.services_by_name["Tools"])
    assert {(r.http_method, r.path, r.body) for r in routes} >= {("POST", "/v1/rpc/Execute", "*"), ("POST", "/v1/rpc/ListTools", "*")}
