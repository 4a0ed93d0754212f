"""A gRPC proxy in front of a real memory service that can hold or refuse the appends of tool
results: every Memory call is passed on as it came (bytes and metadata, the callers' signed
tokens included), except that an append carrying a `tool` message — unary, or carried on
`CarriedCalls` or `AppendStream` — can be held until `release` is set, and then passed on or
refused.

    proxy = await AppendGate.start(memory_target)    # then point the agent at proxy.target
    proxy.hold_answer()          # stored by memory, its acknowledgement held back
    proxy.hold_then_refuse()     # not stored; refused once released (RESOURCE_EXHAUSTED)
    await proxy.seen.wait(); ...; proxy.release.set()
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import grpc

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2

SERVICE = "agentmesh.internal.v1.Memory"
REFUSAL = "the transcript store is full (no space left on device)"


def _has_tool_result(request: memory_service_pb2.AppendMessagesRequest | None) -> bool:
    return request is not None and any(m.role == "tool" for m in request.messages)


def _append_in(call: Any) -> memory_service_pb2.AppendMessagesRequest | None:
    """The append a carried call holds, if it is one (CarriedCalls also carries StartTurn)."""
    if isinstance(call, memory_service_pb2.AppendStreamRequest):
        return call.request
    return call.append_messages if call.WhichOneof("request") == "append_messages" else None


# The streams that carry appends: their request and answer messages, and how the answer to a
# refused call reads.
CARRIERS: dict[str, tuple[Any, Any, Any]] = {
    "AppendStream": (memory_service_pb2.AppendStreamRequest, memory_service_pb2.AppendStreamResponse,
                     lambda status: memory_service_pb2.AppendStreamResponse(status=status)),
    "CarriedCalls": (memory_service_pb2.CarriedMemoryCall, memory_service_pb2.CarriedMemoryAnswer,
                     lambda status: memory_service_pb2.CarriedMemoryAnswer(status=status)),
}


class AppendGate:
    def __init__(self, upstream: str):
        self._channel = grpc.aio.insecure_channel(upstream)
        self._server = grpc.aio.server()
        self.target = ""
        self.refuse = False
        self.holding = False
        self.seen = asyncio.Event()  # a tool result's append has arrived
        self.release = asyncio.Event()

    @classmethod
    async def start(cls, upstream: str) -> "AppendGate":
        gate = cls(upstream)
        gate._server.add_generic_rpc_handlers([gate._handlers()])
        port = gate._server.add_insecure_port("127.0.0.1:0")
        gate.target = f"127.0.0.1:{port}"
        await gate._server.start()
        return gate

    async def stop(self) -> None:
        self.release.set()
        await self._server.stop(grace=0.5)
        await self._channel.close()

    def hold_answer(self) -> None:
        self.holding, self.refuse = True, False

    def hold_then_refuse(self) -> None:
        self.holding, self.refuse = True, True

    # --- passing calls on ---

    def _handlers(self) -> grpc.GenericRpcHandler:
        methods = memory_service_pb2.DESCRIPTOR.services_by_name["Memory"].methods
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in methods:
            path = f"/{SERVICE}/{method.name}"
            if method.name in CARRIERS:
                request_type, answer_type, _ = CARRIERS[method.name]
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                    self._carried(method.name), request_deserializer=request_type.FromString,
                    response_serializer=answer_type.SerializeToString)
            elif method.name == "AppendMessages":
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._append, request_deserializer=memory_service_pb2.AppendMessagesRequest.FromString,
                    response_serializer=memory_service_pb2.AppendMessagesResponse.SerializeToString)
            elif method.server_streaming and method.client_streaming:
                raise AssertionError(f"no pass-through for the stream {method.name}")
            elif method.server_streaming:
                handlers[method.name] = grpc.unary_stream_rpc_method_handler(self._unary_stream(path))
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(self._unary(path))
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    @staticmethod
    def _metadata(context: grpc.aio.ServicerContext) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in context.invocation_metadata() or ()
                if not k.startswith(":") and not k.startswith("grpc-") and k != "user-agent"]

    def _unary(self, path: str):
        call = self._channel.unary_unary(path)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await call(request, metadata=self._metadata(context))
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "")
        return forward

    def _unary_stream(self, path: str):
        call = self._channel.unary_stream(path)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async for answer in call(request, metadata=self._metadata(context)):
                yield answer
        return forward

    async def _append(self, request: memory_service_pb2.AppendMessagesRequest,
                      context: grpc.aio.ServicerContext) -> memory_service_pb2.AppendMessagesResponse:
        held = self.holding and _has_tool_result(request)
        if held:
            self.seen.set()
            if self.refuse:
                await self.release.wait()
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, REFUSAL)
        call = self._channel.unary_unary(f"/{SERVICE}/AppendMessages",
                                         request_serializer=memory_service_pb2.AppendMessagesRequest.SerializeToString,
                                         response_deserializer=memory_service_pb2.AppendMessagesResponse.FromString)
        answer = await call(request, metadata=self._metadata(context))
        if held:
            await self.release.wait()
        return answer

    def _carried(self, name: str):
        request_type, answer_type, refusal = CARRIERS[name]
        path = f"/{SERVICE}/{name}"

        async def forward(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            upstream = self._channel.stream_stream(
                path, request_serializer=request_type.SerializeToString,
                response_deserializer=answer_type.FromString)(metadata=self._metadata(context))
            answers: asyncio.Queue[Any] = asyncio.Queue()
            held_ids: set[int] = set()
            refusals: list[asyncio.Task[None]] = []

            async def refuse_later(call_id: int) -> None:
                await self.release.wait()
                await answers.put(refusal(common_pb2.CarriedStatus(
                    id=call_id, code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message=REFUSAL)))

            async def pass_requests() -> None:
                async for request in requests:
                    if self.holding and _has_tool_result(_append_in(request)):
                        self.seen.set()
                        if self.refuse:
                            refusals.append(asyncio.create_task(refuse_later(request.call.id)))
                            continue
                        held_ids.add(request.call.id)
                    await upstream.write(request)
                await upstream.done_writing()

            async def pass_answers() -> None:
                async for answer in upstream:
                    if answer.status.id in held_ids:
                        await self.release.wait()
                    await answers.put(answer)
                await answers.put(None)

            pumps = [asyncio.create_task(pass_requests()), asyncio.create_task(pass_answers())]
            try:
                while (answer := await answers.get()) is not None:
                    yield answer
            finally:
                for task in pumps + refusals:
                    task.cancel()
                upstream.cancel()
        return forward
