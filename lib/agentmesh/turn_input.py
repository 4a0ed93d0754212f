"""What a valid turn request is: a session id, the user's message and its `ChatOptions`.

One definition, so the gateway (which refuses a bad request before anything is written or
forwarded) and the agent (which checks again, as defence in depth, with its own bounds) refuse
the same requests with the same sentences, each naming the field at fault (the error's
`field` metadata). Which bounds apply is the caller's: `TurnLimits` from its settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentmesh import error_reasons
from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id
from agentmesh.models import DEFAULT_MODEL, ModelCatalog
from agentmesh.modes import validate_mode
from agentmesh.toolpolicy import validate_permission_mode, validate_policy

__all__ = [
    "IF_BUSY_POLICIES",
    "MAX_APPROVAL_TOOLS",
    "MAX_MODEL_NAME_CHARS",
    "MAX_TOOL_NAME_CHARS",
    "TurnLimits",
    "validate_if_busy",
    "validate_turn",
]

# What a message to a busy session does (ChatOptions.if_busy); the first is the default.
IF_BUSY_POLICIES = ("reject", "enqueue", "interrupt", "rollback")
_AGENT_REF = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}(@[1-9][0-9]{0,8})?$")  # as memory/agents.py
MAX_APPROVAL_TOOLS = 64
MAX_TOOL_NAME_CHARS = 128
MAX_MODEL_NAME_CHARS = 200


@dataclass(frozen=True)
class TurnLimits:
    """The bounds a service holds a turn request to (the gateway's are configurable and lower)."""

    max_message_chars: int
    max_iterations_cap: int


def validate_if_busy(value: str, what: str = "options.if_busy") -> str:
    if value and value not in IF_BUSY_POLICIES:
        raise InvalidArgument(f"{what} must be one of {', '.join(IF_BUSY_POLICIES)}, got {value[:40]!r}", field=what)
    return value


def validate_turn(session_id: str, message: str, options: Any, limits: TurnLimits,
                  models: ModelCatalog | None = None, *, has_images: bool = False) -> None:
    """Refuse (InvalidArgument) a turn request that is malformed or out of bounds. `options` is
    an `agentmesh.v1.ChatOptions`; with `models`, the model it names must be one of them (or the
    default model's own id). A turn that carries images may have no text (`has_images`); the
    images themselves are checked by `agentmesh.images.validate_images`."""
    validate_id(session_id)
    if not message.strip() and not has_images:
        raise InvalidArgument("message is empty: send the text of the user's turn", field="message")
    if len(message) > limits.max_message_chars:
        raise InvalidArgument(f"message is {len(message)} characters; the limit is {limits.max_message_chars}",
                              field="message")
    tools = options.approval_tools
    if len(tools) > MAX_APPROVAL_TOOLS:
        raise InvalidArgument(f"options.approval_tools lists {len(tools)} names; at most {MAX_APPROVAL_TOOLS}",
                              field="options.approval_tools")
    if any(not name.strip() or len(name) > MAX_TOOL_NAME_CHARS for name in tools):
        raise InvalidArgument(
            f"options.approval_tools: each entry is a tool name of 1-{MAX_TOOL_NAME_CHARS} characters, or \"*\"",
            field="options.approval_tools",
        )
    cap = limits.max_iterations_cap
    if not 0 <= options.max_iterations <= cap:
        raise InvalidArgument(f"options.max_iterations must be between 0 and {cap}", field="options.max_iterations")
    if len(options.system_prompt) > limits.max_message_chars:
        raise InvalidArgument(f"options.system_prompt is {len(options.system_prompt)} characters; "
                              f"the limit is {limits.max_message_chars}", field="options.system_prompt")
    model = options.model
    if len(model) > MAX_MODEL_NAME_CHARS:
        raise InvalidArgument(f"options.model is longer than {MAX_MODEL_NAME_CHARS} characters", field="options.model")
    if model and models is not None and models.get(model) is None:
        default = models.get(DEFAULT_MODEL)
        if default is None or model != default.model:
            raise InvalidArgument(models.unknown_model_message(model), field="options.model",
                                  reason=error_reasons.UNKNOWN_MODEL, metadata={"model": model[:80]})
    validate_mode(options.mode)
    validate_if_busy(options.if_busy)
    validate_permission_mode(options.permission_mode, "options.permission_mode")
    if options.HasField("tools"):
        validate_policy(options.tools.allow, options.tools.deny, "options.tools")
    agent = getattr(options, "agent", "")
    if agent and not _AGENT_REF.match(agent):
        # Only the form here: whether the agent exists is the memory service's answer (NOT_FOUND).
        raise InvalidArgument(f"options.agent {agent[:80]!r} is not NAME or NAME@VERSION (a named agent of the "
                              "session's namespace: ListAgents)", field="options.agent")
    for name in ("token_budget", "session_token_budget"):
        if getattr(options, name) < 0:
            raise InvalidArgument(f"options.{name} must be 0 (the configured budget) or a positive number of tokens",
                                  field=f"options.{name}")
