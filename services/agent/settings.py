"""Agent knobs, from AGENTMESH_AGENT_* (the table in docs/agent.md). LLM settings live in
`agentmesh.config.LLMSettings` (AGENTMESH_LLM_*), shared with the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from agentmesh.config import env_bool, env_float, env_int, env_str

DEFAULT_SYSTEM_PROMPT = (
    "You are agentmesh, an autonomous assistant that gets work done with tools. "
    "Think about what the user needs, use tools when they help, check what tools return, "
    "and finish with a short, direct answer that says what you did and what you found."
)


@dataclass(frozen=True)
class AgentSettings:
    # Reported as gen_ai.agent.name on the invoke_agent span.
    name: str = "agentmesh"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # Model calls with tools per turn; after that, one tool-less call for a summary.
    max_iterations: int = 12
    # Largest max_iterations a request may ask for.
    max_iterations_cap: int = 100
    # Context budget in characters (roughly 4 per token) for everything sent to the model.
    context_budget_chars: int = 400_000
    # Each tool output is cut to this many characters (head and tail kept) in the model's context.
    tool_output_chars: int = 16_000
    # Tool calls of one reply that run at the same time.
    tool_concurrency: int = 8
    # Tool calls one reply may make; the rest are answered with an error result, not run.
    max_tool_calls: int = 32
    # Upper bound for one tool call's RPC (the tool's own limit is usually shorter).
    tool_timeout_s: float = 900.0
    # Memories recalled into the system prompt at turn start (0 disables recall).
    recall_k: int = 5
    recall_timeout_s: float = 5.0
    # Bound on the RPCs to the memory service for transcripts.
    memory_timeout_s: float = 30.0
    # Output token cap per model call; 0 leaves it to the server (Anthropic, which requires
    # one, then gets 4096). Unset by default: some OpenAI models refuse `max_tokens`.
    max_tokens: int = 0
    # Backoff between model retries: base * 2^attempt seconds, jittered, capped.
    retry_base_s: float = 0.5
    retry_max_s: float = 20.0
    # Longest Retry-After the agent honours; longer asks fail the call instead of stalling.
    retry_after_max_s: float = 60.0
    connect_timeout_s: float = 10.0
    # Tool names whose calls wait for a person's approval before they run ("*": every tool);
    # empty: none do. A turn's ChatOptions.approval_tools adds to this set, never removes.
    approval_tools: frozenset[str] = frozenset()
    # A held call with no decision after this long is denied (and the turn goes on).
    approval_timeout_s: float = 600.0
    # Deep work (ChatOptions.mode "deep", see deep.py): the step budget when the turn names
    # none (still capped by max_iterations_cap), and a reflection on the plan every N steps (0: never).
    deep_max_iterations: int = 50
    deep_reflect_every: int = 8
    # Sub-agents (delegate_task, see subagents.py): how deep delegation may nest, how many
    # sub-agents one turn may start, each one's step budget and wall-clock limit, and the
    # modes in which the tool is offered at the top level.
    subagent_max_depth: int = 1
    max_subagents: int = 8
    subagent_max_iterations: int = 12
    subagent_timeout_s: float = 900.0
    subagent_modes: frozenset[str] = frozenset({"deep"})
    # Compaction (compaction.py): when the history nears the budget, the oldest turns are
    # summarised by the model (durably, in the transcript) instead of being dropped.
    compaction: bool = True
    # Compact when the history the model would see passes this many characters; 0: 3/4 of the budget.
    compact_at_chars: int = 0
    # Newest whole turns kept verbatim after compacting, in characters; 0: 1/4 of the budget.
    compact_keep_chars: int = 0

    # A loop that finishes well (guards.py, budget.py; docs/agent.md). 0 switches each off.
    # A reply cut off by the output limit (finish_reason "length") is continued up to this many times.
    max_continuations: int = 3
    # This many steps before the step budget ends, the model is told to wrap up.
    wrap_up_steps: int = 2
    # In what is sent each step, this turn's tool results older than the newest N become a one-line placeholder.
    keep_tool_results: int = 8
    # The same tool call (same arguments) this many times in a row, or an A-B-A-B cycle, is a loop.
    repeat_limit: int = 3
    # Token budgets (input + output, sub-agents included) per turn and per session; 0: none.
    turn_token_budget: int = 0
    session_token_budget: int = 0
    # Share of a budget at which a status event warns and the model is told to wrap up.
    budget_warn_at: float = 0.8
    # Reasoning a model emits (reasoning_content, <think>): False keeps it out of what is stored
    # and sent back; True stores it with the reply, as <think>…</think> before the text.
    keep_reasoning: bool = False
    # Offer the `think` tool (thinking.py): a scratchpad with no effects.
    think_tool: bool = True
    # Modes whose turns get the task board (task_create/update/get/list; task_tools.py).
    task_modes: frozenset[str] = frozenset({"deep"})
    # Plan mode: revisions after a denial before the turn ends with stop_reason "plan_rejected".
    plan_revisions: int = 3
    # Deep work: nudges to go on after a text-only reply while tasks are still open.
    deep_nudges: int = 2

    @property
    def compaction_threshold_chars(self) -> int:
        return self.compact_at_chars or self.context_budget_chars * 3 // 4

    @property
    def compaction_keep_chars(self) -> int:
        # Never more than half the threshold, or a compacted history could be over it again at once.
        return min(self.compact_keep_chars or self.context_budget_chars // 4, self.compaction_threshold_chars // 2)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "AgentSettings":
        p = "AGENTMESH_AGENT_"
        return cls(
            name=env_str(env, p + "NAME", cls.name),
            system_prompt=env_str(env, p + "SYSTEM_PROMPT", cls.system_prompt),
            max_iterations=env_int(env, p + "MAX_ITERATIONS", cls.max_iterations, minimum=1),
            max_iterations_cap=env_int(env, p + "MAX_ITERATIONS_CAP", cls.max_iterations_cap, minimum=1),
            context_budget_chars=env_int(env, p + "CONTEXT_BUDGET_CHARS", cls.context_budget_chars, minimum=1000),
            tool_output_chars=env_int(env, p + "TOOL_OUTPUT_CHARS", cls.tool_output_chars, minimum=200),
            tool_concurrency=env_int(env, p + "TOOL_CONCURRENCY", cls.tool_concurrency, minimum=1),
            max_tool_calls=env_int(env, p + "MAX_TOOL_CALLS", cls.max_tool_calls, minimum=1),
            tool_timeout_s=env_float(env, p + "TOOL_TIMEOUT_S", cls.tool_timeout_s, minimum=1),
            recall_k=env_int(env, p + "RECALL_K", cls.recall_k, minimum=0),
            recall_timeout_s=env_float(env, p + "RECALL_TIMEOUT_S", cls.recall_timeout_s, minimum=0.1),
            memory_timeout_s=env_float(env, p + "MEMORY_TIMEOUT_S", cls.memory_timeout_s, minimum=0.1),
            max_tokens=env_int(env, p + "MAX_TOKENS", cls.max_tokens, minimum=0),
            retry_base_s=env_float(env, p + "RETRY_BASE_S", cls.retry_base_s, minimum=0),
            retry_max_s=env_float(env, p + "RETRY_MAX_S", cls.retry_max_s, minimum=0),
            retry_after_max_s=env_float(env, p + "RETRY_AFTER_MAX_S", cls.retry_after_max_s, minimum=0),
            connect_timeout_s=env_float(env, p + "CONNECT_TIMEOUT_S", cls.connect_timeout_s, minimum=0.1),
            approval_tools=parse_tool_names(env_str(env, p + "APPROVAL_TOOLS")),
            approval_timeout_s=env_float(env, p + "APPROVAL_TIMEOUT_S", cls.approval_timeout_s, minimum=0.1),
            deep_max_iterations=env_int(env, p + "DEEP_MAX_ITERATIONS", cls.deep_max_iterations, minimum=1),
            deep_reflect_every=env_int(env, p + "DEEP_REFLECT_EVERY", cls.deep_reflect_every, minimum=0),
            subagent_max_depth=env_int(env, p + "SUBAGENT_MAX_DEPTH", cls.subagent_max_depth, minimum=0),
            max_subagents=env_int(env, p + "MAX_SUBAGENTS", cls.max_subagents, minimum=0),
            subagent_max_iterations=env_int(env, p + "SUBAGENT_MAX_ITERATIONS", cls.subagent_max_iterations, minimum=1),
            subagent_timeout_s=env_float(env, p + "SUBAGENT_TIMEOUT_S", cls.subagent_timeout_s, minimum=1),
            subagent_modes=parse_tool_names(env_str(env, p + "SUBAGENT_MODES", "deep")),
            compaction=env_bool(env, p + "COMPACTION", cls.compaction),
            compact_at_chars=env_int(env, p + "COMPACT_AT_CHARS", cls.compact_at_chars, minimum=0),
            compact_keep_chars=env_int(env, p + "COMPACT_KEEP_CHARS", cls.compact_keep_chars, minimum=0),
            max_continuations=env_int(env, p + "MAX_CONTINUATIONS", cls.max_continuations, minimum=0),
            wrap_up_steps=env_int(env, p + "WRAP_UP_STEPS", cls.wrap_up_steps, minimum=0),
            keep_tool_results=env_int(env, p + "KEEP_TOOL_RESULTS", cls.keep_tool_results, minimum=0),
            repeat_limit=env_int(env, p + "REPEAT_LIMIT", cls.repeat_limit, minimum=0),
            turn_token_budget=env_int(env, p + "TURN_TOKEN_BUDGET", cls.turn_token_budget, minimum=0),
            session_token_budget=env_int(env, p + "SESSION_TOKEN_BUDGET", cls.session_token_budget, minimum=0),
            budget_warn_at=env_float(env, p + "BUDGET_WARN_AT", cls.budget_warn_at, minimum=0.0),
            keep_reasoning=env_bool(env, p + "KEEP_REASONING", cls.keep_reasoning),
            think_tool=env_bool(env, p + "THINK_TOOL", cls.think_tool),
            task_modes=parse_tool_names(env_str(env, p + "TASK_MODES", "deep")),
            plan_revisions=env_int(env, p + "PLAN_REVISIONS", cls.plan_revisions, minimum=0),
            deep_nudges=env_int(env, p + "DEEP_NUDGES", cls.deep_nudges, minimum=0),
        )


def parse_tool_names(text: str) -> frozenset[str]:
    """`"shell, python,,web_fetch"` -> {"shell", "python", "web_fetch"}."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())
