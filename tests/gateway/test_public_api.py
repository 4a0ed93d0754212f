"""The public API is agentmesh.v1 alone: what a client reflecting the gateway can see.

SDKs and docs are generated from the public package, so the services only the platform calls
(Agent, Tools, Memory) and their messages live in agentmesh.internal.v1 and are neither listed
by the gateway's reflection nor reachable from the public files' dependencies.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_SERVICES = {"agentmesh.v1.Gateway", "agentmesh.v1.Scheduler"}


async def reflect(channel: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    async for answer in stub.ServerReflectionInfo(iter([request]), timeout=10):
        return answer
    raise AssertionError("reflection answered nothing")


async def public_files(channel: grpc.aio.Channel, symbol: str) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Every file the gateway's reflection hands out for `symbol`, with its dependencies."""
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    answer = await reflect(channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol))
    pending = list(answer.file_descriptor_response.file_descriptor_proto)
    while pending:
        proto = descriptor_pb2.FileDescriptorProto.FromString(pending.pop())
        if proto.name in files:
            continue
        files[proto.name] = proto
        for dependency in proto.dependency:
            if dependency not in files:
                more = await reflect(channel, reflection_pb2.ServerReflectionRequest(file_by_filename=dependency))
                pending.extend(more.file_descriptor_response.file_descriptor_proto)
    return files


async def test_the_gateways_reflection_lists_only_public_services(tmp_path):
    async with Stack(tmp_path / "home", services=("memory", "tools", "agent", "gateway")) as stack:
        channel = stack.user_channel("gateway")
        answer = await reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
        listed = {service.name for service in answer.list_services_response.service}
        assert listed == {"agentmesh.v1.Gateway", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}

        files = await public_files(channel, "agentmesh.v1.Gateway")
        ours = {name: proto for name, proto in files.items() if name.startswith("agentmesh/")}
        assert ours and all(proto.package == "agentmesh.v1" for proto in ours.values()), sorted(ours)
        services = {f"{proto.package}.{service.name}" for proto in ours.values() for service in proto.service}
        assert services <= PUBLIC_SERVICES, services


def test_the_public_proto_package_declares_only_the_public_services():
    public = sorted((ROOT / "protos/agentmesh/v1").glob("*.proto"))
    assert public
    for path in public:
        text = path.read_text()
        assert "package agentmesh.v1;" in text
        assert "agentmesh/internal/" not in text, f"{path.name} imports an internal file"
        declared = {line.split()[1] for line in text.splitlines() if line.startswith("service ")}
        assert {f"agentmesh.v1.{name}" for name in declared} <= PUBLIC_SERVICES, (path.name, declared)
    internal = {path.name for path in (ROOT / "protos/agentmesh/internal/v1").glob("*.proto")}
    assert internal == {"agent_service.proto", "memory_service.proto", "tools_service.proto"}
