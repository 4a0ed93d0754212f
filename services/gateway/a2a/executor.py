"""An agentmesh turn as an A2A task.

The a2a-sdk's request handler owns the protocol (JSON-RPC methods, the task store, streaming,
`tasks/cancel`); this executor is the part it leaves to the agent. An A2A context is an agentmesh
session (the context id is the session id, created in the endpoint's namespace), an A2A task is
one turn (its run id and trace id are in the task's status metadata), the reply streams as the
`reply` artifact, tool calls and results as `working` status messages, and cancelling the task
is the gateway's `Cancel` of the session.
"""

from __future__ import annotations

import json

from a2a.helpers import new_task, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, TaskState
from google.protobuf.json_format import MessageToDict

from agentmesh.errors import AgentmeshError
from agentmesh.gateway.http.loopback import CallerRefused, GatewayCalls
from agentmesh.logs import get_logger
from agentmesh.v1 import gateway_pb2

log = get_logger("agentmesh.gateway.a2a")

REPLY_ARTIFACT = "reply"
# The message metadata key (and session label) that counts A2A hops; the tools service's remote
# A2A agent tools read the label of their session and send one more.
DEPTH_LABEL = "agentmesh.a2a.depth"
# Status metadata saying why a task was refused, for an agentmesh caller to tell the model.
REASON_KEY = "agentmesh.reason"
MAX_STATUS_TEXT = 2000

# How a run's stop reason ends its task: a person stopped it, or it ran to an end of its own.
_CANCELLED = {"cancelled", "interrupted", "rolled_back"}


def _authorization(context: RequestContext) -> str | None:
    headers = context.call_context.state.get("headers") or {}
    value = headers.get("authorization")
    return value if isinstance(value, str) else None


def user_text(message: Message | None) -> str:
    """The words of an A2A message: its text parts, and data parts as JSON."""
    if message is None:
        return ""
    pieces: list[str] = []
    for part in message.parts:
        if part.HasField("text"):
            pieces.append(part.text)
        elif part.HasField("data"):
            pieces.append(json.dumps(MessageToDict(part.data)))
    return "\n".join(p for p in pieces if p)


def message_depth(message: Message | None) -> int:
    """How many A2A hops deep the message is: what the calling agentmesh put in its metadata (0
    from a person's client, or from an agent that does not count)."""
    if message is None or DEPTH_LABEL not in message.metadata:
        return 0
    value = message.metadata[DEPTH_LABEL]
    return int(value) if isinstance(value, (int, float)) and 0 <= value < 1000 else 0


class TurnExecutor(AgentExecutor):
    """Runs each A2A message as one turn of the namespace's agent, or of its named agent `agent`."""

    def __init__(self, calls: GatewayCalls, namespace: str, max_depth: int, agent: str = ""):
        self._calls = calls
        self._options = gateway_pb2.ChatOptions(agent=agent) if agent else None
        self._namespace = namespace
        self._max_depth = max_depth

    def _agent_message(self, updater: TaskUpdater, text: str) -> Message:
        return updater.new_agent_message([new_text_part(text[:MAX_STATUS_TEXT])])

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, session_id = context.task_id or "", context.context_id or ""
        if context.current_task is None:
            await event_queue.enqueue_event(new_task(task_id, session_id, TaskState.TASK_STATE_SUBMITTED,
                                                     history=[context.message] if context.message else []))
        updater = TaskUpdater(event_queue, task_id, session_id)
        text = user_text(context.message)
        if not text.strip():
            await updater.reject(self._agent_message(updater, "the message has no text: send a text part"))
            return
        depth = message_depth(context.message)
        if depth > self._max_depth:
            await updater.update_status(TaskState.TASK_STATE_REJECTED, self._agent_message(updater, (
                f"this message is {depth} A2A hops deep and this agent takes at most {self._max_depth} "
                "(AGENTMESH_GATEWAY_A2A_MAX_DEPTH): agents calling each other stop here, which ends loops")),
                metadata={REASON_KEY: "depth_limit"})
            return
        authorization = _authorization(context)
        try:
            await self._calls.open_session(session_id, self._namespace, "A2A: " + text[:80], authorization,
                                           labels={DEPTH_LABEL: str(depth)} if depth else None)
            await self._run(updater, session_id, text, authorization)
        except CallerRefused as exc:
            await updater.update_status(TaskState.TASK_STATE_AUTH_REQUIRED, self._agent_message(updater, exc.message))
        except AgentmeshError as exc:
            await updater.failed(self._agent_message(updater, f"{exc.code}: {exc.message}"))

    async def _run(self, updater: TaskUpdater, session_id: str, text: str, authorization: str | None) -> None:
        streamed = False
        async for event in self._calls.chat(session_id, text, authorization, self._options):
            kind = event.WhichOneof("payload")
            if kind == "run_started":
                started = event.run_started
                await updater.start_work()
                await updater.update_status(TaskState.TASK_STATE_WORKING, metadata={
                    "agentmesh_run_id": started.run_id, "agentmesh_trace_id": started.trace_id,
                    "agentmesh_session_id": session_id,
                })
            elif kind == "text_delta" and event.text_delta.text:
                await updater.add_artifact([new_text_part(event.text_delta.text)], artifact_id=REPLY_ARTIFACT,
                                           name=REPLY_ARTIFACT, append=streamed or None)
                streamed = True
            elif kind == "tool_call":
                call = event.tool_call
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING, self._agent_message(updater, f"calling {call.name} {call.arguments_json}"),
                    metadata={"agentmesh_event": "tool_call", "tool": call.name, "call_id": call.call_id})
            elif kind == "tool_result":
                result = event.tool_result.result
                verdict = f"error ({result.error_kind})" if result.is_error else "ok"
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING, self._agent_message(updater, f"{result.name}: {verdict}"),
                    metadata={"agentmesh_event": "tool_result", "tool": result.name, "call_id": result.call_id,
                              "is_error": result.is_error})
            elif kind == "approval_request":
                request = event.approval_request
                await updater.update_status(TaskState.TASK_STATE_WORKING, self._agent_message(
                    updater, f"{request.name} waits for a person's approval (agentmesh Approve, call {request.call_id})"))
            elif kind == "run_finished":
                finished = event.run_finished
                if not streamed and finished.final_text:
                    await updater.add_artifact([new_text_part(finished.final_text)], artifact_id=REPLY_ARTIFACT,
                                               name=REPLY_ARTIFACT)
                ending = self._agent_message(updater, finished.final_text or finished.stop_reason)
                metadata = {"agentmesh_stop_reason": finished.stop_reason, "agentmesh_trace_id": finished.trace_id}
                state = (TaskState.TASK_STATE_CANCELED if finished.stop_reason in _CANCELLED
                         else TaskState.TASK_STATE_COMPLETED)
                await updater.update_status(state, ending, metadata=metadata)
                return
            elif kind == "error":
                await updater.failed(self._agent_message(updater, f"{event.error.code}: {event.error.message}"))
                return
        await updater.failed(self._agent_message(updater, "the turn ended without finishing"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        session_id = context.context_id or ""
        try:
            await self._calls.cancel(session_id, _authorization(context))
        except (CallerRefused, AgentmeshError) as exc:
            log.warning("A2A cancel: the gateway refused Cancel", session_id=session_id, error=str(exc))
        updater = TaskUpdater(event_queue, context.task_id or "", session_id)
        await updater.cancel(self._agent_message(updater, "cancelled"))
