"""The loop's image port (loop/ports.py `ImageFiles`) over the tools service's workspace calls:
a session's images are files of its workspace under `.attachments/` (agentmesh.images)."""

from __future__ import annotations

import grpc

from agentmesh.clients.tools import ToolsClient
from agentmesh.errors import InvalidArgument
from agentmesh.rpc.peers import peer_error
from agentmesh.telemetry.propagation import trace_metadata
from agentmesh.v1 import tools_pb2

__all__ = ["GrpcImageFiles"]


class GrpcImageFiles:
    def __init__(self, client: ToolsClient, *, timeout_s: float = 30.0):
        self._stub = client.stub
        self._peer = client.peer
        self._timeout_s = timeout_s

    async def write(self, session_id: str, path: str, data: bytes) -> None:
        request = tools_pb2.WriteWorkspaceFileRequest(session_id=session_id, path=path, content=data)
        try:
            await self._stub.WriteWorkspaceFile(request, timeout=self._timeout_s, metadata=trace_metadata())
        except grpc.aio.AioRpcError as err:
            # The name is the bytes' hash: a file already there holds this very image.
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise peer_error(err, self._peer) from None

    async def read(self, session_id: str, path: str, max_bytes: int) -> bytes:
        request = tools_pb2.ReadWorkspaceFileRequest(session_id=session_id, path=path, max_bytes=max_bytes)
        try:
            reply = await self._stub.ReadWorkspaceFile(request, timeout=self._timeout_s, metadata=trace_metadata())
        except grpc.aio.AioRpcError as err:
            raise peer_error(err, self._peer) from None
        if reply.truncated:
            raise InvalidArgument(f"{path} is {reply.size} bytes; images of at most {max_bytes} bytes are taken "
                                  "(AGENTMESH_AGENT_MAX_IMAGE_BYTES)")
        return bytes(reply.content)
