"""The narrow interfaces the agent loop depends on. `adapters/` implements them over gRPC;
tests implement them in a few lines each, so the loop is tested without the wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from agentmesh.agent.types import BackgroundDone, ChatMessage, ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError

if TYPE_CHECKING:
    from agentmesh.agent.loop.model_choice import NamedModel
    from agentmesh.agent.loop.session_open import NamedAgent, OpenedSession, SessionToOpen
    from agentmesh.models import ModelSpec

__all__ = [
    "BackgroundCheck",
    "BackgroundCommands",
    "ChildSessions",
    "ImageFiles",
    "LearningAnswer",
    "ListedCatalog",
    "LongTermMemory",
    "MemoryHit",
    "NamedAgents",
    "NamespaceModels",
    "NotSupported",
    "ToolRunner",
    "TranscriptStore",
    "TurnBeginning",
    "TurnLearning",
    "TurnStarter",
]


class NotSupported(AgentmeshError):
    """The peer does not implement this (yet): callers degrade instead of failing the turn."""

    code = "UNIMPLEMENTED"


class ToolRunner(Protocol):
    async def list_tools(self, namespace: str = "", *, mcp_version: float | None = None) -> list[ToolSpec]:
        """The tool catalog (with the namespace's own MCP servers' tools, as of the namespace's
        mcp_servers_version when known); raises an AgentmeshError when the tools service is
        unreachable."""
        ...

    async def execute(self, session_id: str, call: ToolCall, namespace: str = "", *,
                      mcp_version: float | None = None, sandbox_template: str = "", isolation: str = "") -> ToolOutcome:
        """Run one call (command tools in `sandbox_template` with `isolation`; "": the defaults). Tool failures and outages come back as an error outcome, never raised;
        cancelling the awaiting task cancels the call (and kills its sandboxed process)."""
        ...


class ImageFiles(Protocol):
    """Images stored in a session's workspace (agentmesh.images): each written once, under
    `.attachments/`, and read back when a model request is built."""

    async def write(self, session_id: str, path: str, data: bytes) -> None:
        """Store `data` at `path` (an existing file of the same name holds the same bytes: the
        name is their hash). Raises an AgentmeshError (INVALID_ARGUMENT for a refused file)."""
        ...

    async def read(self, session_id: str, path: str, max_bytes: int) -> bytes:
        """The file's bytes; raises an AgentmeshError (NOT_FOUND, INVALID_ARGUMENT for a path
        that leaves the workspace or a file larger than `max_bytes`)."""
        ...


class ListedCatalog(Protocol):
    """The tool catalog as a turn reads it: kept between turns while it holds (tool_catalog.py)."""

    async def tools(self, namespace: str, mcp_version: float | None = None) -> list[ToolSpec]:
        """The namespace's catalog (as of its mcp_servers_version when known); raises an
        AgentmeshError when the tools service is unreachable."""
        ...


class TranscriptStore(Protocol):
    async def load(self, session_id: str) -> list[ChatMessage]:
        """The session's transcript in order (empty for a new session)."""
        ...

    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        """Durably append, in order; raises an AgentmeshError when it cannot."""
        ...


@dataclass(frozen=True)
class MemoryHit:
    id: str
    text: str
    kind: str
    score: float
    created_at: float = 0.0


class LongTermMemory(Protocol):
    async def remember(self, namespace: str, text: str, kind: str, source_session_id: str) -> MemoryHit:
        """Upsert a memory; raises NotSupported or another AgentmeshError."""
        ...

    async def search(self, namespace: str, query: str, k: int) -> list[MemoryHit]:
        """Top-k memories for `query`, best first; raises NotSupported or another AgentmeshError."""
        ...


@dataclass(frozen=True)
class TurnBeginning:
    stored: list[ChatMessage]  # the session's transcript before the turn's first messages
    memories: list[MemoryHit]  # recalled for the turn
    recall_error: str = ""  # why recall failed (the turn goes on without it)
    # What it read for the learning capabilities (capabilities/learning.py's `Learned`, handed to
    # them unread: `TurnLearning`); None: nothing (not asked, or a memory service that cannot),
    # so they read it themselves.
    learned: Any = None
    # The session `opening` put (session_open.py); None: not asked, or a memory service that
    # ignores it (older than it).
    opened: "OpenedSession | None" = None


class TurnStarter(Protocol):
    """A turn's first reads and write in one round trip (the memory service's StartTurn)."""

    async def start(self, session_id: str, first: Sequence[ChatMessage], *, namespace: str, query: str,
                    k: int, recall_timeout_s: float, learning: frozenset[str] = frozenset(),
                    opening: "SessionToOpen | None" = None) -> TurnBeginning:
        """The stored transcript, then `first` durably appended after it, and the `k` memories
        recalled for `query` (k = 0: none), and the `learning` parts of the namespace
        (learning.py). With `opening`, the session is put first (created in `namespace` when
        missing) and the rest happens in the namespace it is stored in; its settings come back
        in `opened`. Raises an AgentmeshError when the transcript cannot be read or written, or
        the session not opened; a failed recall is `recall_error`, not raised."""
        ...

    async def open(self, session_id: str, namespace: str, opening: "SessionToOpen") -> "OpenedSession":
        """The session put on its own (a memory service whose StartTurn cannot), with its
        namespace's settings."""
        ...


@dataclass(frozen=True)
class BackgroundCheck:
    finished: list[BackgroundDone]
    running: int  # the session's commands still running when asked


class BackgroundCommands(Protocol):
    """The tools service's background commands (background_run), seen from the agent."""

    def may_have(self, session_id: str) -> bool:
        """Whether the session may have commands to collect or still running (False only when
        the tools service has said it has none, background_sessions.py)."""
        ...

    async def take_finished(self, session_id: str) -> "BackgroundCheck":
        """Commands that ended since the last ask, each handed over once, and how many still
        run; raises an AgentmeshError."""
        ...

    async def stop(self, session_id: str) -> int:
        """Stop every running background command of the session; raises an AgentmeshError."""
        ...


class ChildSessions(Protocol):
    """Creates sub-agents' sessions (capabilities/subagents.py)."""

    async def open_child(self, session_id: str, *, parent_session_id: str, namespace: str, title: str) -> None:
        """Create the child's session record (a no-op when it exists); raises an AgentmeshError."""
        ...


class NamedAgents(Protocol):
    """A namespace's named agents (docs/agents.md), for delegating to one by name (subagents.py)."""

    async def get(self, namespace: str, ref: str) -> "NamedAgent":
        """"NAME" or "NAME@VERSION"; raises an AgentmeshError (NotFound for an unknown one)."""
        ...

    async def list(self, namespace: str) -> "list[NamedAgent]":
        """Every agent of the namespace, built-ins included."""
        ...


class LearningAnswer(Protocol):
    """Where a turn's start hands what it brought for the learning capabilities."""

    def answer(self, learned: Any) -> None:
        """What the start brought (`TurnBeginning.learned`); None: nothing, they read it themselves."""
        ...

    def fail(self, reason: str) -> None:
        """The start failed: every part it was to bring failed with `reason`."""
        ...


class TurnLearning(Protocol):
    """What the agent reads to learn across sessions (capabilities/learning.py's `LearningSources`),
    as the loop sees it: which parts a turn's start should bring, and one turn's view of it
    served from what that start brings."""

    def parts(self) -> frozenset[str]:
        """What a turn's start should bring (none: the capabilities read it themselves)."""
        ...

    def for_turn(self) -> "tuple[TurnLearning, LearningAnswer]":
        """One turn's sources, their first reads served from what its start brings (answered
        through the second)."""
        ...


class NamespaceModels(Protocol):
    """A namespace's own models (ModelConfig resources), their providers built on first use."""

    def named(self, spec: "ModelSpec") -> "NamedModel":
        """The model `spec` describes (its namespace, name and fields: an edit is another one),
        its key read from the namespace's mounted Secret; FailedPrecondition when it is not there."""
