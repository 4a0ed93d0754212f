"""Protobuf messages <-> the cores' dataclasses (the only place that knows both)."""

from __future__ import annotations

from typing import Any, Iterable

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.memory.memory_records import MemoryQuery, MemoryRecord, RememberItem
from agentmesh.memory.namespaces import NamespaceRecord
from agentmesh.memory.transcript_records import SessionChanges, SessionRecord, ToolCallRecord, TranscriptMessage
from agentmesh.rpc.convert import dict_from_struct, struct_from_dict
from agentmesh.toolpolicy import ToolPolicy
from agentmesh.v1 import common_pb2, sessions_pb2


def session_from_proto(s: sessions_pb2.Session) -> SessionRecord:
    return SessionRecord(
        session_id=s.session_id,
        title=s.title,
        created_at=s.created_at,
        updated_at=s.updated_at,
        labels=dict(s.labels),
        namespace=s.namespace,
        created_by=s.created_by,  # PutSession sets its own caller's; RestoreSession keeps the file's
    )


def session_to_proto(s: SessionRecord) -> sessions_pb2.Session:
    return sessions_pb2.Session(
        session_id=s.session_id,
        title=s.title,
        created_at=s.created_at,
        updated_at=s.updated_at,
        message_count=s.message_count,
        labels=s.labels,
        namespace=s.namespace,
        model=s.model,
        permission_mode=s.permission_mode,
        tools=common_pb2.ToolPolicy(allow=s.tools_allow, deny=s.tools_deny),
        agent=s.agent,
        agent_version=s.agent_version,
        created_by=s.created_by,
        sandbox_template=s.sandbox_template,
        record_model_calls=s.record_model_calls,
    )


def session_changes(request: sessions_pb2.UpdateSessionRequest) -> SessionChanges:
    """The fields an UpdateSession changes: those its update_mask names, else as the request
    shows them (see sessions.proto); the gateway checked the mask's paths."""
    paths = set(request.update_mask)
    if not paths:
        given_tools = request.HasField("tools")
        if request.permission_mode:
            paths.add("permission_mode")
        if given_tools:
            paths.add("tools")
        if request.sandbox_template:
            paths.add("sandbox_template")
        if request.model or not paths:
            paths.add("model")
    return SessionChanges(
        model=request.model if "model" in paths else None,
        permission_mode=request.permission_mode if "permission_mode" in paths else None,
        sandbox_template=request.sandbox_template if "sandbox_template" in paths else None,
        tools=ToolPolicy(tuple(request.tools.allow), tuple(request.tools.deny)) if "tools" in paths else None,
        # Only with a mask naming it: off is the default, so an unmasked request never changes it.
        record_model_calls=request.record_model_calls if "record_model_calls" in paths else None,
    )


def namespace_to_proto(record: NamespaceRecord) -> sessions_pb2.NamespaceSettings:
    return sessions_pb2.NamespaceSettings(
        namespace=record.namespace, updated_at=record.updated_at, mcp_servers_version=record.mcp_servers_version,
        sandbox_template=record.sandbox_template,
        models=[model_to_proto(m) for m in record.models],
        tools=common_pb2.ToolPolicy(allow=record.tools_allow, deny=record.tools_deny),
        retention=sessions_pb2.Retention(transcripts_days=record.transcripts_days, memories_days=record.memories_days,
                                         usage_days=record.usage_days, workspaces_days=record.workspaces_days))


def message_from_proto(m: common_pb2.Message) -> TranscriptMessage:
    return TranscriptMessage(
        role=m.role,
        content=m.content,
        tool_calls=[ToolCallRecord(c.call_id, c.name, c.arguments_json) for c in m.tool_calls],
        tool_call_id=m.tool_call_id,
        name=m.name,
        seq=m.seq,
        run_id=m.run_id,
        created_at=m.created_at,
        kind=m.kind,
        covers_through_seq=m.covers_through_seq,
        images=[_image_record(i) for i in m.images],
    )


def _image_record(image: common_pb2.Image) -> dict[str, Any]:
    # `data` marks a message that carries the bytes, which a transcript refuses (transcripts.py).
    record: dict[str, Any] = {"path": image.path if not image.data else "", "media_type": image.media_type,
                              "name": image.name, "width": image.width, "height": image.height,
                              "size_bytes": image.size_bytes}
    return record


def message_to_proto(m: TranscriptMessage) -> common_pb2.Message:
    out = common_pb2.Message()
    _fill_message(out, m)
    return out


def add_messages(field: Any, messages: Iterable[TranscriptMessage]) -> None:
    """Append `messages` to a repeated Message field of a reply, built in place: a transcript
    goes out whole at every turn's start, and building each message apart and copying it in
    took four times as long."""
    add = field.add
    for m in messages:
        _fill_message(add(), m)


def _fill_message(out: common_pb2.Message, m: TranscriptMessage) -> None:
    # Only the fields that are set: each assignment crosses into protobuf's C code.
    out.role = m.role
    if m.content:
        out.content = m.content
    for c in m.tool_calls:
        out.tool_calls.add(call_id=c.call_id, name=c.name, arguments_json=c.arguments_json)
    if m.tool_call_id:
        out.tool_call_id = m.tool_call_id
    if m.name:
        out.name = m.name
    out.seq = m.seq
    if m.run_id:
        out.run_id = m.run_id
    out.created_at = m.created_at
    if m.kind:
        out.kind = m.kind
    if m.covers_through_seq:
        out.covers_through_seq = m.covers_through_seq
    for image in m.images:
        out.images.add(**image)


def remember_from_proto(r: memory_service_pb2.RememberRequest, default_namespace: str = "") -> RememberItem:
    return RememberItem(
        namespace=r.namespace or default_namespace,
        text=r.text,
        kind=r.kind,
        metadata=dict_from_struct(r.metadata),
        id=r.id,
        source_session_id=r.source_session_id,
        created_at=r.created_at,
        vector=tuple(r.vector),
    )


def filter_from_proto(f: memory_service_pb2.MemoryFilter) -> MemoryQuery:
    return MemoryQuery(
        kinds=tuple(f.kinds),
        metadata=dict_from_struct(f.metadata),
        created_after=f.created_after,
        created_before=f.created_before,
        source_session_id=f.source_session_id,
    )


def memory_to_proto(m: MemoryRecord) -> memory_service_pb2.MemoryRecord:
    return memory_service_pb2.MemoryRecord(
        id=m.id,
        namespace=m.namespace,
        text=m.text,
        kind=m.kind,
        metadata=struct_from_dict(m.metadata),
        created_at=m.created_at,
        updated_at=m.updated_at,
        source_session_id=m.source_session_id,
    )


_MODEL_FIELDS = ("name", "provider", "model", "base_url", "context_window", "max_output_tokens", "fallback",
                 "no_vision", "input_price_per_mtok", "output_price_per_mtok", "api_key_secret", "api_key_secret_key")


def model_from_proto(m: sessions_pb2.NamespaceModel) -> dict[str, Any]:
    """A namespace model as stored: NamespaceModel's fields by name (temperature only when set)."""
    stored: dict[str, Any] = {k: getattr(m, k) for k in _MODEL_FIELDS}
    if m.HasField("temperature"):
        stored["temperature"] = m.temperature
    return stored


def model_to_proto(stored: dict[str, Any]) -> sessions_pb2.NamespaceModel:
    return sessions_pb2.NamespaceModel(**{k: v for k, v in stored.items() if k in (*_MODEL_FIELDS, "temperature")})
