"""Test doubles for the scheduler: a clock tests move by hand, and a real gRPC Gateway
serving `Chat` with behaviour the test controls.

    clock = FakeClock(start)                  # now() is `start` until advanced
    await clock.advance(600)                  # wakes every sleeper whose deadline passed

    async with FakeGateway() as gateway:      # listening on 127.0.0.1:<port>, gateway.target
        gateway.hold = True                   # runs stay open until released (long runs)
        gateway.release_all()
        gateway.fail_when = "FAIL"            # prompts containing it end with a RunError
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import uuid

import grpc

from agentmesh.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


class FakeClock:
    def __init__(self, start: float):
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    @property
    def sleepers(self) -> int:
        """How many tasks are asleep on this clock right now."""
        return sum(1 for _, _, future in self._sleepers if not future.done())

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._order), future))
        await future

    async def advance(self, seconds: float) -> None:
        await self.set(self._now + seconds)

    async def set(self, when: float) -> None:
        self._now = max(self._now, float(when))
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        # Let the woken loops run up to their next await on real I/O.
        for _ in range(5):
            await asyncio.sleep(0)


def _trace_id_of(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            parts = value.split("-")
            if len(parts) == 4:
                return parts[1]
    return uuid.uuid4().hex


class FakeGatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self):
        self.calls: list[gateway_pb2.ChatRequest] = []
        self.authorization: list[str] = []  # the authorization header of each Chat
        self.service_tokens: list[str] = []  # and its service token
        self.hold = False
        self.delay_s = 0.0
        self.fail_when = "FAIL"
        self.cancelled: list[str] = []
        self.started_at: list[float] = []  # wall-clock arrival of each Chat, for benches
        self._gates: dict[str, asyncio.Event] = {}
        self._cancel_requests: dict[str, asyncio.Event] = {}
        self._held: set[str] = set()

    @property
    def active(self) -> list[str]:
        """The sessions whose run is held open (`hold`). A call still being answered is not one:
        counted, it let a test's clock move on while the run was ending, and the next firing
        found it still going (skipped under `forbid`)."""
        return sorted(self._held)

    def release_all(self) -> None:
        for gate in self._gates.values():
            gate.set()

    async def Chat(self, request, context):
        self.started_at.append(time.time())
        self.calls.append(request)
        metadata = dict(context.invocation_metadata() or ())
        self.authorization.append(metadata.get("authorization", ""))
        self.service_tokens.append(metadata.get("x-agentmesh-service-token", ""))
        session = request.session_id
        if session in self._gates:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"session {session!r} is already running a turn")
        trace_id = _trace_id_of(context)
        run_id = f"run-{uuid.uuid4().hex[:8]}"

        def event(seq: int, **payload) -> common_pb2.Event:
            return common_pb2.Event(session_id=session, run_id=run_id, seq=seq, timestamp=time.time(), **payload)

        gate, cancel = asyncio.Event(), asyncio.Event()
        self._gates[session], self._cancel_requests[session] = gate, cancel

        def end_turn() -> None:
            # Before the last event goes out: the client may start the next turn the moment it
            # reads it, and must not find this one still registered.
            if self._gates.get(session) is gate:
                del self._gates[session]
                del self._cancel_requests[session]

        try:
            yield event(1, run_started=common_pb2.RunStarted(session_id=session, run_id=run_id, trace_id=trace_id))
            if self.fail_when and self.fail_when in request.message:
                end_turn()
                yield event(2, error=common_pb2.RunError(code="UNAVAILABLE", message="the model is unreachable"))
                return
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.hold:
                self._held.add(session)
                waiters = [asyncio.ensure_future(gate.wait()), asyncio.ensure_future(cancel.wait())]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._held.discard(session)
                for waiter in waiters:
                    waiter.cancel()
            end_turn()
            if cancel.is_set():
                yield event(2, run_finished=common_pb2.RunFinished(trace_id=trace_id, stop_reason="cancelled"))
                return
            yield event(2, text_delta=common_pb2.TextDelta(text="done: "))
            yield event(3, run_finished=common_pb2.RunFinished(
                final_text=f"done: {request.message}", trace_id=trace_id, stop_reason="completed", iterations=1))
        finally:
            end_turn()

    async def Cancel(self, request, context):
        cancel = self._cancel_requests.get(request.session_id)
        if cancel is None:
            return gateway_pb2.CancelResponse(cancelled=False)
        self.cancelled.append(request.session_id)
        cancel.set()
        return gateway_pb2.CancelResponse(cancelled=True)


class FakeGateway:
    """A gRPC server on 127.0.0.1:0 serving FakeGatewayServicer; attribute access passes through."""

    def __init__(self):
        self.servicer = FakeGatewayServicer()
        self.server: grpc.aio.Server | None = None
        self.target = ""

    def __getattr__(self, name):
        return getattr(self.servicer, name)

    def __setattr__(self, name, value):
        if name in ("hold", "delay_s", "fail_when"):
            setattr(self.servicer, name, value)
        else:
            super().__setattr__(name, value)

    async def __aenter__(self) -> "FakeGateway":
        self.server = grpc.aio.server()
        gateway_pb2_grpc.add_GatewayServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.target = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.servicer.release_all()
        await self.server.stop(0.5)
