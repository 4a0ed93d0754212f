"""What a session and a transcript message are, as the transcript core (transcripts.py) stores and
returns them: the records, their payloads in the store, and what an update of a session changes.
Validation and ordering are the core's; these are the shapes it works on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentmesh.ids import DEFAULT_NAMESPACE
from agentmesh.toolpolicy import ToolPolicy


@dataclass
class SessionRecord:
    session_id: str
    title: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    message_count: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = DEFAULT_NAMESPACE
    model: str = ""  # the named model its turns use ("": the deployment's default)
    permission_mode: str = ""  # "auto" | "normal" | "manual"; "": the deployment's
    tools_allow: list[str] = field(default_factory=list)  # the session's tool policy (toolpolicy.py)
    tools_deny: list[str] = field(default_factory=list)
    # The named agent and version its latest turn ran (agents.py); "" / 0: none.
    agent: str = ""
    agent_version: int = 0
    # The latest step's tool calls ([call id, tool name, run id]) and the ids answered so far,
    # kept by `_append` so that a call gets one result, ever (`_one_result_per_call`).
    step_calls: list[list[str]] = field(default_factory=list)
    step_answered: list[str] = field(default_factory=list)
    step_before: list[str] = field(default_factory=list)  # the step before's call ids: closed, answered
    # The principal (its subject, "user:alice") the session was opened for: what erasing a
    # person finds their sessions by (retention.py). "": opened by a service, or before it was kept.
    created_by: str = ""
    # When retention last removed its workspace (retention.py): a sweep names it again only
    # once it was used after that.
    workspace_removed_at: float = 0.0
    sandbox_template: str = ""  # "": the namespace's (docs/tools.md#sandbox-templates)
    record_model_calls: bool = False  # its turns record their model calls' payloads (ListModelCalls)
    # Changes whenever the transcript changes other than by an append (a run dropped, the
    # transcript cleared, the session created again): what lets a caller that keeps the
    # transcript it read ask for what was appended since (Transcripts.read_then_append).
    # "": a record written before it was kept, which no caller's copy is trusted against.
    generation: str = ""

    def payload(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "title": self.title,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "message_count": self.message_count,
            "labels": dict(self.labels),
            "namespace": self.namespace,
            "model": self.model,
            "permission_mode": self.permission_mode,
            "tools_allow": list(self.tools_allow),
            "tools_deny": list(self.tools_deny),
            "agent": self.agent,
            "agent_version": self.agent_version,
            "step_calls": [list(c) for c in self.step_calls],
            "step_answered": list(self.step_answered),
            "step_before": list(self.step_before),
            "created_by": self.created_by,
            "workspace_removed_at": self.workspace_removed_at,
            "sandbox_template": self.sandbox_template,
            "record_model_calls": self.record_model_calls,
            "generation": self.generation,
        }

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "SessionRecord":
        return cls(
            session_id=p["session_id"],
            title=p.get("title", ""),
            created_at=float(p.get("created_at", 0.0)),
            updated_at=float(p.get("updated_at", 0.0)),
            message_count=int(p.get("message_count", 0)),
            labels=dict(p.get("labels") or {}),
            namespace=p.get("namespace") or DEFAULT_NAMESPACE,
            model=p.get("model", ""),
            permission_mode=p.get("permission_mode", ""),
            tools_allow=list(p.get("tools_allow") or []),
            tools_deny=list(p.get("tools_deny") or []),
            agent=p.get("agent", ""),
            agent_version=int(p.get("agent_version", 0)),
            step_calls=[list(c) for c in p.get("step_calls") or []],
            step_answered=list(p.get("step_answered") or []),
            step_before=list(p.get("step_before") or []),
            created_by=str(p.get("created_by") or ""),
            workspace_removed_at=float(p.get("workspace_removed_at", 0.0)),
            sandbox_template=str(p.get("sandbox_template") or ""),
            record_model_calls=bool(p.get("record_model_calls", False)),
            generation=str(p.get("generation") or ""),
        )


@dataclass(frozen=True)
class SessionChanges:
    """What an UpdateSession changes; None leaves a field as it is."""

    model: str | None = None
    permission_mode: str | None = None
    tools: ToolPolicy | None = None
    # (name, version) of the named agent a turn runs, set by StartTurn (agents.py).
    agent: tuple[str, int] | None = None
    sandbox_template: str | None = None
    record_model_calls: bool | None = None


@dataclass
class ToolCallRecord:
    call_id: str
    name: str
    arguments_json: str


@dataclass
class TranscriptMessage:
    role: str
    content: str = ""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""
    seq: int = 0
    run_id: str = ""
    created_at: float = 0.0
    kind: str = ""  # "" | "summary" (the agent's compaction summary)
    covers_through_seq: int = 0  # kind == "summary": last seq it stands in for
    # Images by reference to the workspace's stored copy (agentmesh.images), never their bytes.
    images: list[dict[str, Any]] = field(default_factory=list)

    def payload(self, session_id: str) -> dict[str, Any]:
        return {
            "session_id": session_id,
            "seq": self.seq,
            "role": self.role,
            "content": self.content,
            "tool_calls": [vars(c) for c in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "run_id": self.run_id,
            "created_at": self.created_at,
            "kind": self.kind,
            "covers_through_seq": self.covers_through_seq,
            **({"images": self.images} if self.images else {}),
        }

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "TranscriptMessage":
        # Positional, in field order: a turn's start decodes the whole transcript.
        get = p.get
        calls = get("tool_calls")
        return cls(
            p["role"],
            get("content", ""),
            [ToolCallRecord(**c) for c in calls] if calls else [],
            get("tool_call_id", ""),
            get("name", ""),
            int(p["seq"]),
            get("run_id", ""),
            float(get("created_at", 0.0)),
            get("kind", ""),
            int(get("covers_through_seq", 0)),
            get("images") or [],
        )


