"""How a turn calls its model; loop.py decides when. One call is: the request (the system
prompt, the history fitted to the context budget, this turn's messages through every
capability's `view`), sent to the turn's model and, when that fails, to the catalogue's
fallback (model_choice.py); a step's reply cut off by the output limit is continued.

**A call beside the write before it.** A step's tool results are the last thing saved before
the next model call, and the call needs nothing from that write: the results are in the turn's
messages already. So the loop hands the unsaved write to `call` (`pending_write`), which starts
the model call at once and saves meanwhile; the reply is returned — and so persisted, shown or
acted on — only once the write is acknowledged. Until then the turn's events are withheld
(loop.py `_emit`): the model's streamed deltas are sent after the results they follow. If the
write fails or the turn is stopped meanwhile, the call is cancelled and the error is the
write's, as without the overlap; a reply that already came is dropped unseen and unsaved (its
tokens are counted all the same: model_call.py records usage as the reply arrives).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Awaitable, Callable, Sequence

from agentmesh.agent.loop import context
from agentmesh.agent.loop.model_call import traced_model_call
from agentmesh.agent.loop.model_choice import ModelChoice
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import ChatMessage, ModelReply, ModelRequest, StatusEvent
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

log = get_logger("agentmesh.agent")

# Finish reasons of a reply cut off by the output token limit (OpenAI, Anthropic).
CUT_OFF = frozenset({"length", "max_tokens"})


class TurnModel:
    """The model calls of one turn. `pending_write()`: the save the next call may overlap (taken
    by that call), or None."""

    def __init__(self, ctx: TurnContext, capabilities: list[Capability], models: ModelChoice,
                 pending_write: Callable[[], Awaitable[None] | None]):
        self.ctx = ctx
        self.capabilities = capabilities
        self.models = models
        self.pending_write = pending_write
        self.calls = 0  # the turn's `iterations`

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
        """One model call (TurnContext.call_model), beside the pending write if there is one."""
        self.calls += 1
        write = self.pending_write()
        if write is None:
            return await self._reply(self._request(turn, extra, allow_tools))
        reply = asyncio.create_task(self._reply_after_write(turn, extra, allow_tools),
                                    name=f"model-call-{self.ctx.request.run_id}")
        try:
            await write
        except BaseException:
            # The write failed or the turn was stopped: the reply must leave no trace.
            reply.cancel()
            await asyncio.gather(reply, return_exceptions=True)
            raise
        return await reply  # a cancel of the turn here cancels the call too

    async def _reply_after_write(self, turn: Sequence[ChatMessage], extra: Sequence[ChatMessage],
                                 allow_tools: bool) -> ModelReply:
        # One hop of the event loop first, so the write this call overlaps goes out before the
        # request is built and sent (the append's stream writer was woken after this task was
        # started). The turn's messages do not change meanwhile: the turn waits for the write.
        await asyncio.sleep(0)
        return await self._reply(self._request(turn, extra, allow_tools))

    def _request(self, turn: Sequence[ChatMessage], extra: Sequence[ChatMessage], allow_tools: bool) -> ModelRequest:
        ctx, s = self.ctx, self.ctx.settings
        tools, memories = ctx.tools, ctx.memories
        base = ctx.request.system_prompt or s.system_prompt
        sections = [text for capability in self.capabilities for text in capability.system_sections()]
        now = ctx.agent.clock()
        system = context.system_prompt(base, now=now, tools=tools, memories=memories, sections=sections)
        kept, current, omitted = context.fit(
            system, ctx.history, [*self._view(turn), *extra], budget_chars=s.context_budget_chars,
            tool_output_chars=s.tool_output_chars,
        )
        if omitted:  # the prompt then says how many messages were left out
            system = context.system_prompt(base, now=now, tools=tools, memories=memories, omitted=omitted,
                                           sections=sections)
        return ModelRequest(
            model=ctx.model,
            messages=[ChatMessage(role="system", content=system), *kept, *current],
            tools=tools,
            allow_tools=allow_tools,
            max_tokens=s.max_tokens,
        )

    def _view(self, turn: Sequence[ChatMessage]) -> list[ChatMessage]:
        messages = list(turn)
        for capability in self.capabilities:
            messages = capability.view(messages)
        return messages

    async def _reply(self, request: ModelRequest) -> ModelReply:
        """The reply of the turn's model, or of its fallback when it fails."""
        ctx = self.ctx
        while True:
            chosen = self.models.current
            request = dataclasses.replace(request, model=chosen.model,
                                          max_tokens=chosen.max_output_tokens or request.max_tokens,
                                          temperature=chosen.temperature, top_p=chosen.top_p)
            tag = ctx.usage_tag.for_model(chosen.name, chosen.model, chosen.provider.name,
                                          fallback=self.models.fell_back)
            try:
                return await traced_model_call(chosen.provider, ctx.agent.telemetry, request,
                                               usage=ctx.usage, emit=ctx.emit, tag=tag)
            except AgentmeshError as exc:
                fallback = self.models.fall_back()
                if fallback is None:
                    raise
                log.warning("model failed; falling back", model=chosen.name, fallback=fallback.name, error=exc.message)
                ctx.emit(StatusEvent(f"model {chosen.name!r} failed ({exc.message}); "
                                     f"falling back to {fallback.name!r}"))
                ctx.model = fallback.model
