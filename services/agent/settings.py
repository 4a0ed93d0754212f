"""Agent knobs, from AGENTMESH_AGENT_* (the table in docs/agent.md). LLM settings live in
`agentmesh.config.LLMSettings` (AGENTMESH_LLM_*), shared with the CLI."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.config import EnvSection, env

DEFAULT_SYSTEM_PROMPT = (
    "You are agentmesh, an autonomous assistant that gets work done with tools. "
    "Think about what the user needs, use tools when they help, check what tools return, "
    "and finish with a short, direct answer that says what you did and what you found."
)


def parse_tool_names(text: str) -> frozenset[str]:
    """`"shell, python,,web_fetch"` -> {"shell", "python", "web_fetch"}."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class AgentSettings(EnvSection):
    # Reported as gen_ai.agent.name on the invoke_agent span.
    name: str = env("AGENTMESH_AGENT_NAME", "agentmesh")
    system_prompt: str = env("AGENTMESH_AGENT_SYSTEM_PROMPT", DEFAULT_SYSTEM_PROMPT)
    # Model calls with tools per turn; after that, one tool-less call for a summary.
    max_iterations: int = env("AGENTMESH_AGENT_MAX_ITERATIONS", 12, minimum=1)
    # Largest max_iterations a request may ask for.
    max_iterations_cap: int = env("AGENTMESH_AGENT_MAX_ITERATIONS_CAP", 100, minimum=1)
    # A model's context window in tokens when its catalogue entry names none (loop/window.py):
    # the budget of what is sent is this less the room kept for the answer.
    context_window: int = env("AGENTMESH_AGENT_CONTEXT_WINDOW", 32_768, minimum=1024)
    # An extra cap in characters on everything sent to the model; 0: the model's window alone decides.
    context_budget_chars: int = env("AGENTMESH_AGENT_CONTEXT_BUDGET_CHARS", 0, minimum=0)
    # Each tool output is cut to this many characters (head and tail kept) in the model's context.
    tool_output_chars: int = env("AGENTMESH_AGENT_TOOL_OUTPUT_CHARS", 16_000, minimum=200)
    # The largest image the agent reads back into a model request (a user's, a tool's); the
    # gateway's AGENTMESH_GATEWAY_MAX_IMAGE_BYTES bounds what users attach.
    max_image_bytes: int = env("AGENTMESH_AGENT_MAX_IMAGE_BYTES", 5 * 1024 * 1024, minimum=1024)
    # Images one model request carries as pixels, newest first, and their bytes together; older
    # ones are a line of text. Every call resends the history, and APIs bound a request's size.
    max_request_images: int = env("AGENTMESH_AGENT_MAX_REQUEST_IMAGES", 20, minimum=0)
    max_request_image_bytes: int = env("AGENTMESH_AGENT_MAX_REQUEST_IMAGE_BYTES", 20 * 1024 * 1024, minimum=0)
    # Tool calls of one reply that run at the same time.
    tool_concurrency: int = env("AGENTMESH_AGENT_TOOL_CONCURRENCY", 8, minimum=1)
    # Tool calls one reply may make; the rest are answered with an error result, not run.
    max_tool_calls: int = env("AGENTMESH_AGENT_MAX_TOOL_CALLS", 32, minimum=1)
    # Upper bound for one tool call's RPC (the tool's own limit is usually shorter).
    tool_timeout_s: float = env("AGENTMESH_AGENT_TOOL_TIMEOUT_S", 900.0, minimum=1)
    # Memories recalled into the system prompt at turn start (0 disables recall).
    recall_k: int = env("AGENTMESH_AGENT_RECALL_K", 5, minimum=0)
    recall_timeout_s: float = env("AGENTMESH_AGENT_RECALL_TIMEOUT_S", 5.0, minimum=0.1)
    # Bound on the RPCs to the memory service for transcripts.
    memory_timeout_s: float = env("AGENTMESH_AGENT_MEMORY_TIMEOUT_S", 30.0, minimum=0.1)
    # How long a model call's usage record waits for its step's append to carry it before it is
    # sent alone (adapters/memory.py UsageOutbox): the append follows at once on a healthy machine.
    usage_hold_s: float = env("AGENTMESH_AGENT_USAGE_HOLD_S", 0.02, minimum=0)
    # Output token cap per model call; 0 leaves it to the server (Anthropic, which requires
    # one, then gets 4096). Unset by default: some OpenAI models refuse `max_tokens`.
    max_tokens: int = env("AGENTMESH_AGENT_MAX_TOKENS", 0, minimum=0)
    # Backoff between model retries: base * 2^attempt seconds, jittered, capped.
    retry_base_s: float = env("AGENTMESH_AGENT_RETRY_BASE_S", 0.5, minimum=0)
    retry_max_s: float = env("AGENTMESH_AGENT_RETRY_MAX_S", 20.0, minimum=0)
    # Longest Retry-After the agent honours; longer asks fail the call instead of stalling.
    retry_after_max_s: float = env("AGENTMESH_AGENT_RETRY_AFTER_MAX_S", 60.0, minimum=0)
    connect_timeout_s: float = env("AGENTMESH_AGENT_CONNECT_TIMEOUT_S", 10.0, minimum=0.1)
    # Tool names whose calls wait for a person's approval before they run ("*": every tool);
    # empty: none do. A turn's ChatOptions.approval_tools adds to this set, never removes.
    approval_tools: frozenset[str] = env("AGENTMESH_AGENT_APPROVAL_TOOLS", frozenset(), parse=parse_tool_names)
    # A held call with no decision after this long is denied (and the turn goes on).
    approval_timeout_s: float = env("AGENTMESH_AGENT_APPROVAL_TIMEOUT_S", 600.0, minimum=0.1)
    # Deep work (ChatOptions.mode "deep", see deep.py): the step budget when the turn names
    # none (still capped by max_iterations_cap), and a reflection on the plan every N steps (0: never).
    deep_max_iterations: int = env("AGENTMESH_AGENT_DEEP_MAX_ITERATIONS", 50, minimum=1)
    deep_reflect_every: int = env("AGENTMESH_AGENT_DEEP_REFLECT_EVERY", 8, minimum=0)
    # Sub-agents (delegate_task, see subagents.py): how deep delegation may nest, how many
    # sub-agents one turn may start, each one's step budget and wall-clock limit, and the
    # modes in which the tool is offered at the top level.
    subagent_max_depth: int = env("AGENTMESH_AGENT_SUBAGENT_MAX_DEPTH", 2, minimum=0)
    max_subagents: int = env("AGENTMESH_AGENT_MAX_SUBAGENTS", 8, minimum=0)
    subagent_max_iterations: int = env("AGENTMESH_AGENT_SUBAGENT_MAX_ITERATIONS", 12, minimum=1)
    subagent_timeout_s: float = env("AGENTMESH_AGENT_SUBAGENT_TIMEOUT_S", 900.0, minimum=1)
    subagent_modes: frozenset[str] = env("AGENTMESH_AGENT_SUBAGENT_MODES", frozenset({"default", "deep"}),
                                         parse=parse_tool_names)
    # Teams (teams.py, docs/teams.md): a top-level turn may spawn teammates — agent runs of their
    # own in child sessions — at most `team_max_teammates` per team and `team_max_per_namespace`
    # not finished in a namespace; each runs at most `team_max_iterations` model calls and ends once
    # idle (no mail, no open task) for `team_idle_s`.
    teams: bool = env("AGENTMESH_AGENT_TEAMS", True)
    team_max_teammates: int = env("AGENTMESH_AGENT_TEAM_MAX_TEAMMATES", 5, minimum=1)
    team_max_per_namespace: int = env("AGENTMESH_AGENT_TEAM_MAX_PER_NAMESPACE", 20, minimum=1)
    team_max_iterations: int = env("AGENTMESH_AGENT_TEAM_MAX_ITERATIONS", 40, minimum=1)
    team_idle_s: float = env("AGENTMESH_AGENT_TEAM_IDLE_S", 120.0, minimum=0)
    # How long the lead's read_inbox waits at most for a message when its inbox is empty.
    team_inbox_wait_s: float = env("AGENTMESH_AGENT_TEAM_INBOX_WAIT_S", 300.0, minimum=0)
    # A teammate whose run ended with an error (its agent replica died mid-turn, or its turn
    # failed) is started again in its session by the lead, at most `team_restarts` times; the
    # lead looks at its teammates' runs at least every `team_check_s` while it waits for mail.
    team_restarts: int = env("AGENTMESH_AGENT_TEAM_RESTARTS", 2, minimum=0)
    team_check_s: float = env("AGENTMESH_AGENT_TEAM_CHECK_S", 5.0, minimum=0.1)
    # Compaction (compaction.py): when the context nears the budget — before a turn or between
    # its steps — the oldest part is summarised by the model (durably, in the transcript)
    # instead of being dropped.
    compaction: bool = env("AGENTMESH_AGENT_COMPACTION", True)
    # Compact when the context the model would see passes this many characters; 0: 3/4 of the budget.
    compact_at_chars: int = env("AGENTMESH_AGENT_COMPACT_AT_CHARS", 0, minimum=0)
    # Newest whole turns kept verbatim after compacting, in characters; 0: 1/4 of the budget.
    compact_keep_chars: int = env("AGENTMESH_AGENT_COMPACT_KEEP_CHARS", 0, minimum=0)

    # A loop that finishes well (guards.py, budget.py; docs/agent.md). 0 switches each off.
    # A reply cut off by the output limit (finish_reason "length") is continued up to this many times.
    max_continuations: int = env("AGENTMESH_AGENT_MAX_CONTINUATIONS", 3, minimum=0)
    # This many steps before the step budget ends, the model is told to wrap up.
    wrap_up_steps: int = env("AGENTMESH_AGENT_WRAP_UP_STEPS", 2, minimum=0)
    # In what is sent each step, this turn's tool results older than the newest N become a one-line placeholder.
    keep_tool_results: int = env("AGENTMESH_AGENT_KEEP_TOOL_RESULTS", 8, minimum=0)
    # The same tool call (same arguments) this many times in a row, or an A-B-A-B cycle, is a loop.
    repeat_limit: int = env("AGENTMESH_AGENT_REPEAT_LIMIT", 3, minimum=0)
    # Token budgets (input + output, sub-agents included) per turn and per session; 0: none.
    turn_token_budget: int = env("AGENTMESH_AGENT_TURN_TOKEN_BUDGET", 0, minimum=0)
    session_token_budget: int = env("AGENTMESH_AGENT_SESSION_TOKEN_BUDGET", 0, minimum=0)
    # Share of a budget at which a status event warns and the model is told to wrap up.
    budget_warn_at: float = env("AGENTMESH_AGENT_BUDGET_WARN_AT", 0.8, minimum=0.0)
    # Reasoning a model emits (reasoning_content, <think>): False keeps it out of what is stored
    # and sent back; True stores it with the reply, as <think>…</think> before the text.
    keep_reasoning: bool = env("AGENTMESH_AGENT_KEEP_REASONING", False)
    # Record each model call's request and response for the dev panel (Gateway.ListModelCalls;
    # loop/call_payloads.py): off by default; each side cut at model_call_max_chars.
    record_model_calls: bool = env("AGENTMESH_AGENT_RECORD_MODEL_CALLS", False)
    # Where the namespaces' model keys are mounted: <dir>/<namespace>/<secret>/<key>, one
    # Kubernetes Secret volume each (docs/agents.md#modelconfig); "": namespace models have no keys.
    model_secrets_dir: str = env("AGENTMESH_MODEL_SECRETS_DIR", "")
    model_call_max_chars: int = env("AGENTMESH_AGENT_MODEL_CALL_MAX_CHARS", 200_000, minimum=1000, maximum=1_000_000)
    # Offer the `think` tool (thinking.py): a scratchpad with no effects.
    think_tool: bool = env("AGENTMESH_AGENT_THINK_TOOL", True)
    # Modes whose turns get the task board (task_create/update/get/list; task_tools.py).
    task_modes: frozenset[str] = env("AGENTMESH_AGENT_TASK_MODES", frozenset({"default", "deep"}),
                                     parse=parse_tool_names)
    # The task board and delegate_task are offered (in the modes above) only to a model whose
    # context window holds at least this many tokens: their tools and results crowd a small one.
    reach_min_window: int = env("AGENTMESH_AGENT_REACH_MIN_WINDOW", 16_384, minimum=0)
    # Plan mode: revisions after a denial before the turn ends with stop_reason "plan_rejected".
    plan_revisions: int = env("AGENTMESH_AGENT_PLAN_REVISIONS", 3, minimum=0)
    # Deep work: nudges to go on after a text-only reply while tasks are still open.
    deep_nudges: int = env("AGENTMESH_AGENT_DEEP_NUDGES", 2, minimum=0)
