"""Protobuf messages <-> the cores' dataclasses (the only place that knows both)."""

from __future__ import annotations

from agentmesh.memory.memories import MemoryQuery, MemoryRecord, RememberItem
from agentmesh.memory.transcripts import SessionRecord, ToolCallRecord, TranscriptMessage
from agentmesh.rpc.convert import dict_from_struct, struct_from_dict
from agentmesh.v1 import common_pb2, memory_pb2, sessions_pb2


def session_from_proto(s: sessions_pb2.Session) -> SessionRecord:
    return SessionRecord(
        session_id=s.session_id,
        title=s.title,
        created_at=s.created_at,
        updated_at=s.updated_at,
        labels=dict(s.labels),
        namespace=s.namespace,
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
    )


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
    )


def message_to_proto(m: TranscriptMessage) -> common_pb2.Message:
    return common_pb2.Message(
        role=m.role,
        content=m.content,
        tool_calls=[
            common_pb2.ToolCall(call_id=c.call_id, name=c.name, arguments_json=c.arguments_json) for c in m.tool_calls
        ],
        tool_call_id=m.tool_call_id,
        name=m.name,
        seq=m.seq,
        run_id=m.run_id,
        created_at=m.created_at,
        kind=m.kind,
        covers_through_seq=m.covers_through_seq,
    )


def remember_from_proto(r: memory_pb2.RememberRequest, default_namespace: str = "") -> RememberItem:
    return RememberItem(
        namespace=r.namespace or default_namespace,
        text=r.text,
        kind=r.kind,
        metadata=dict_from_struct(r.metadata),
        id=r.id,
        source_session_id=r.source_session_id,
        created_at=r.created_at,
    )


def filter_from_proto(f: memory_pb2.MemoryFilter) -> MemoryQuery:
    return MemoryQuery(
        kinds=tuple(f.kinds),
        metadata=dict_from_struct(f.metadata),
        created_after=f.created_after,
        created_before=f.created_before,
        source_session_id=f.source_session_id,
    )


def memory_to_proto(m: MemoryRecord) -> memory_pb2.MemoryRecord:
    return memory_pb2.MemoryRecord(
        id=m.id,
        namespace=m.namespace,
        text=m.text,
        kind=m.kind,
        metadata=struct_from_dict(m.metadata),
        created_at=m.created_at,
        updated_at=m.updated_at,
        source_session_id=m.source_session_id,
    )
