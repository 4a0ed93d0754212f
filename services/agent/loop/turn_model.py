"""How a turn calls its model; run.py decides when. One call is: the request (the system
prompt, the history fitted to the context budget, this turn's messages through every
capability's `view`), sent to the turn's model and, when that fails, to the catalogue's
fallback (model_choice.py); a step's reply cut off by the output limit is continued.

**A call beside the write before it.** A step's last tool results are saved beside the next
model call, and shown — with the reply and everything after them — only once saved: that rule is
show_after_save.py's, and `call` runs each model call through it (`ShowAfterSave.beside`). A
reply dropped because the save failed is unseen and unsaved, but its tokens are counted all the
same (model_call.py records usage as the reply arrives).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from agentmesh.agent.loop import context
from agentmesh.agent.loop.images import ImageReads, with_images
from agentmesh.agent.loop.model_call import traced_model_call
from agentmesh.agent.loop.model_choice import ModelChoice
from agentmesh.agent.loop.show_after_save import ShowAfterSave
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.loop.turn_request import workspace_of
from agentmesh.agent.loop.window import ContextBudget
from agentmesh.agent.types import ChatMessage, ModelReply, ModelRequest, RunEvent, StatusEvent, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

log = get_logger("agentmesh.agent")

# Finish reasons of a reply cut off by the output token limit (OpenAI, Anthropic).
CUT_OFF = frozenset({"length", "max_tokens"})


class TurnModel:
    """The model calls of one turn. `shown`: the turn's save-before-show rule, which each call
    goes through (a call starts beside the save of the step's last results, if they are unsaved)."""

    def __init__(self, ctx: TurnContext, capabilities: list[Capability], models: ModelChoice,
                 shown: ShowAfterSave[RunEvent]):
        self.ctx = ctx
        self.capabilities = capabilities
        self.models = models
        self.shown = shown
        self.calls = 0  # the turn's `iterations`
        self.images = ImageReads(ctx.agent.images, workspace_of(ctx.request), ctx.settings.max_image_bytes)

    def choose(self, models: ModelChoice) -> None:
        """The turn's model as its session resolved it (session_open.py)."""
        self.models = models
        self.ctx.model = models.current.model

    async def step_reply(self, turn: list[ChatMessage]) -> ModelReply:
        """One step's reply. A text reply cut off by the output limit is continued — the partial
        text sent back as the assistant's, with a note to go on — up to `max_continuations`
        times, and the pieces stitched into one reply."""
        reply = await self.call(turn, allow_tools=True)
        bound = self.ctx.settings.max_continuations
        pieces, reasoning = [reply.text], [reply.reasoning]
        while reply.finish_reason in CUT_OFF and not reply.tool_calls and len(pieces) <= bound:
            self.ctx.emit(StatusEvent(f"the reply was cut off by the output limit; continuing it "
                                      f"({len(pieces)} of at most {bound})"))
            partial = ChatMessage(role="assistant", content="".join(pieces))
            note = ChatMessage(role="system", content=context.CONTINUE_INSTRUCTION)
            reply = await self.call(turn, extra=[partial, note], allow_tools=True)
            pieces.append(reply.text)
            reasoning.append(reply.reasoning)
        if len(pieces) == 1:
            return reply
        if reply.finish_reason in CUT_OFF and not reply.tool_calls:
            self.ctx.emit(StatusEvent(f"the reply was still cut off after {bound} continuations; keeping what there is"))
        return dataclasses.replace(reply, text="".join(pieces), reasoning="".join(reasoning))

    def stored_text(self, reply: ModelReply) -> str:
        """The reply as stored and sent back: its reasoning only when the settings keep it."""
        if self.ctx.settings.keep_reasoning and reply.reasoning.strip():
            return f"<think>\n{reply.reasoning.strip()}\n</think>\n{reply.text}"
        return reply.text

    async def call(self, turn: Sequence[ChatMessage], *, extra: Sequence[ChatMessage] = (),
                   allow_tools: bool = False) -> ModelReply:
        """One model call (TurnContext.call_model), beside the save of the step's last results
        if they are unsaved (show_after_save.py)."""
        self.calls += 1
        request, chars = self._request(turn, extra, allow_tools)
        if not self.shown.pending:
            return await self._reply(request, chars)
        return await self.shown.beside(lambda: self._reply(request, chars), name=f"model-call-{self.ctx.request.run_id}")

    def budget(self) -> ContextBudget:
        """The next call's budget: the current model's window, its learned characters per token."""
        s, chosen = self.ctx.settings, self.models.current
        return ContextBudget.of(
            chosen.context_window or s.context_window, max_tokens=chosen.max_output_tokens or s.max_tokens,
            chars_per_token=self.ctx.agent.calibration.ratio(chosen.name), cap_chars=s.context_budget_chars,
            compact_at_chars=s.compact_at_chars, compact_keep_chars=s.compact_keep_chars)

    def measure(self, turn: Sequence[ChatMessage]) -> tuple[int, int]:
        """The characters the next call would send for `turn`, before the budget policy trims:
        (system prompt and tools — fixed for the turn —, history and this turn through the views)."""
        ctx, s = self.ctx, self.ctx.settings
        tools = ctx.tools
        sections = [text for capability in self.capabilities for text in capability.system_sections()]
        system = context.system_prompt(ctx.request.system_prompt or s.system_prompt, now=ctx.agent.clock(),
                                       tools=tools, memories=ctx.memories, sections=sections)
        clip_at = min(s.tool_output_chars, self.budget().tool_output_chars)
        return (len(system) + tools_chars(tools),
                sum(context.size_of(m, clip_at) for m in [*ctx.history, *self._view(turn)]))

    def _request(self, turn: Sequence[ChatMessage], extra: Sequence[ChatMessage],
                 allow_tools: bool) -> tuple[ModelRequest, int]:
        """The request, and its size in the characters the budget counts."""
        ctx, s = self.ctx, self.ctx.settings
        tools, memories = ctx.tools, ctx.memories
        base = ctx.request.system_prompt or s.system_prompt
        sections = [text for capability in self.capabilities for text in capability.system_sections()]
        now = ctx.agent.clock()
        system = context.system_prompt(base, now=now, tools=tools, memories=memories, sections=sections)
        budget = self.budget()
        # The tools' schemas are sent with every call and take tokens like the messages.
        declared = tools_chars(tools)
        kept, current, omitted, fitted = context.fit_counted(
            system, ctx.history, [*self._view(turn), *extra], budget_chars=max(budget.chars - declared, 1000),
            tool_output_chars=min(s.tool_output_chars, budget.tool_output_chars),
        )
        fitted -= len(system)  # the messages kept; the prompt is counted as the message it becomes
        if omitted:  # the prompt then says how many messages were left out
            system = context.system_prompt(base, now=now, tools=tools, memories=memories, omitted=omitted,
                                           sections=sections)
        system_message = ChatMessage(role="system", content=system)
        messages = [system_message, *kept, *current]
        chars = declared + context.size_of(system_message) + fitted
        ctx.fill = (budget.tokens(chars), budget.window_tokens)
        return ModelRequest(
            model=ctx.model,
            messages=messages,
            tools=tools,
            allow_tools=allow_tools,
            max_tokens=s.max_tokens,
        ), chars

    def _view(self, turn: Sequence[ChatMessage]) -> list[ChatMessage]:
        messages = list(turn)
        for capability in self.capabilities:
            messages = capability.view(messages)
        return messages

    async def _reply(self, request: ModelRequest, chars: int) -> ModelReply:
        """The reply of the turn's model, or of its fallback when it fails."""
        ctx = self.ctx
        while True:
            chosen = self.models.current
            # A named agent's sampling parameters win over its model's (docs/agents.md).
            agent = ctx.request.agent
            temperature = agent.temperature if agent is not None and agent.temperature is not None \
                else chosen.temperature
            top_p = agent.top_p if agent is not None and agent.top_p is not None else chosen.top_p
            request = dataclasses.replace(request, model=chosen.model,
                                          max_tokens=chosen.max_output_tokens or request.max_tokens,
                                          temperature=temperature, top_p=top_p)
            # After the choice of model: a fallback may take images where the first did not.
            sent = await with_images(request, chosen.vision, self.images, max_images=ctx.settings.max_request_images,
                                     max_bytes=ctx.settings.max_request_image_bytes)
            tag = ctx.usage_tag.for_model(chosen.name, chosen.model, chosen.provider.name,
                                          fallback=self.models.fell_back)
            try:
                # The estimate beside the server's count on the span shows how far it strays.
                estimate = {"agentmesh.context.estimated_tokens": ctx.fill[0],
                            "agentmesh.context.window": ctx.fill[1]}
                reply = await traced_model_call(chosen.provider, ctx.agent.telemetry, sent, usage=ctx.usage,
                                                emit=ctx.emit, tag=tag, extra_attributes=estimate)
                # The server's count of what was sent teaches the model's characters per token.
                ctx.agent.calibration.observe(chosen.name, chars, reply.usage.input_tokens)
                if reply.usage.input_tokens:  # the server's count beats the estimate
                    ctx.fill = (reply.usage.input_tokens, ctx.fill[1])
                return reply
            except AgentmeshError as exc:
                fallback = self.models.fall_back()
                if fallback is None:
                    raise
                log.warning("model failed; falling back", model=chosen.name, fallback=fallback.name, error=exc.message)
                ctx.emit(StatusEvent(f"model {chosen.name!r} failed ({exc.message}); "
                                     f"falling back to {fallback.name!r}"))
                ctx.model = fallback.model


# The size of each tool declaration, by the spec object (the catalog and the capabilities hand
# the same objects to every turn): json.dumps of every schema on every call costs more than the
# rest of the context's measure. Bounded; the specs are held so that their ids stay theirs.
_DECLARED: dict[int, tuple[ToolSpec, int]] = {}
_DECLARED_MAX = 4096


def tools_chars(tools: Sequence[ToolSpec]) -> int:
    """What the tools' declarations add to a request, in characters."""
    total = 0
    for t in tools:
        known = _DECLARED.get(id(t))
        if known is None or known[0] is not t:
            if len(_DECLARED) >= _DECLARED_MAX:
                _DECLARED.clear()
            known = _DECLARED[id(t)] = (t, len(t.name) + len(t.description) + len(json.dumps(t.parameters)) + 16)
        total += known[1]
    return total
