"""Every model call's usage, recorded durably: one `UsageEntry` per call — the loop's steps,
deep mode's planning and reflection, summaries, continuations, sub-agents' turns, and calls a
fallback model answered — sent to the memory service's usage ledger (services/memory/usage.py),
which `Gateway.GetUsage` sums.

`traced_model_call` (model_call.py) is the one place every model call goes through; it hands the
reply's usage to the `UsageTag` its caller gives, which knows the turn and the model. A ledger
that cannot be reached costs a warning, never the turn: the tokens are still in the turn's
`run_finished` usage and in its `chat` spans.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agentmesh.agent.types import Usage
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

__all__ = ["UsageEntry", "UsageLog", "UsageTag"]

if TYPE_CHECKING:
    from agentmesh.agent.loop.call_payloads import CallRecorder

log = get_logger("agentmesh.agent")


@dataclass(frozen=True)
class UsageEntry:
    id: str
    at: float
    session_id: str
    run_id: str
    namespace: str
    model_name: str  # the catalogue's name ("default": the AGENTMESH_LLM_* model)
    model: str  # the id the provider's API knows it by
    provider: str
    usage: Usage
    fallback: bool = False
    purpose: str = "turn"  # "turn" | "compaction"
    root_session_id: str = ""  # a sub-agent's top-level session


class UsageLog(Protocol):
    def record(self, entry: UsageEntry) -> "asyncio.Future[None]":
        """Start recording one model call durably, without waiting: the future is done once the
        record is stored, and fails (an AgentmeshError, a TimeoutError) when it cannot be."""
        ...


@dataclass
class UsageTag:
    """Who a model call is for; `record` writes its entry to the log (None: not recorded)."""

    log: UsageLog | None
    session_id: str
    run_id: str
    namespace: str
    root_session_id: str
    timeout_s: float
    model_name: str = "default"
    model: str = ""
    provider: str = ""
    fallback: bool = False
    purpose: str = "turn"
    # Writes in flight, shared by every tag of the turn (for_model): the turn waits for them
    # (`flush`) before it ends, but no model call waits for its own.
    pending: set[asyncio.Future[None]] = field(default_factory=set)
    # Records each call's request and response (call_payloads.py); None: recording is off.
    calls: "CallRecorder | None" = None

    def for_model(self, model_name: str, model: str, provider: str, *, fallback: bool = False,
                  purpose: str = "turn") -> "UsageTag":
        return UsageTag(self.log, self.session_id, self.run_id, self.namespace, self.root_session_id, self.timeout_s,
                        model_name, model, provider, fallback, purpose, self.pending, self.calls)

    def record(self, usage: Usage) -> None:
        """Start writing the call's record: the turn goes on meanwhile (one memory round trip
        per model call was measurable on a quick model, benches/turn_overhead.py)."""
        if self.log is None:
            return
        entry = UsageEntry(
            # Unique per call without a UUID object per call; the run id keeps ids apart across runs.
            id=f"{self.run_id}.{secrets.token_hex(6)}", at=time.time(), session_id=self.session_id,
            run_id=self.run_id, namespace=self.namespace, model_name=self.model_name, model=self.model,
            provider=self.provider, usage=Usage(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens),
            fallback=self.fallback, purpose=self.purpose, root_session_id=self.root_session_id,
        )
        stored = self.log.record(entry)
        self.pending.add(stored)
        stored.add_done_callback(functools.partial(self._settled, entry))

    async def flush(self) -> None:
        """Until every record started so far is stored or given up on (at most `timeout_s`): a
        turn's usage is in the ledger by the time its run_finished is sent."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout_s):
                while self.pending:
                    await asyncio.gather(*list(self.pending), return_exceptions=True)

    def _settled(self, entry: UsageEntry, stored: "asyncio.Future[None]") -> None:
        self.pending.discard(stored)
        error = None if stored.cancelled() else stored.exception()
        if isinstance(error, (AgentmeshError, TimeoutError)):
            reason = error.message if isinstance(error, AgentmeshError) else "it took too long"
            log.warning("model call usage not recorded", error=reason, model=entry.model_name,
                        input_tokens=entry.usage.input_tokens, output_tokens=entry.usage.output_tokens)
        elif error is not None:
            log.error("model call usage not recorded", error=f"{type(error).__name__}: {error}",
                      model=entry.model_name)
