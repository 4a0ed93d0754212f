"""The team tools as the model sees them (docs/teams.md), with openagent-core's names and
arguments: the lead's and the teammates'."""

from __future__ import annotations

from typing import Any

from agentmesh.agent.types import ToolSpec
from agentmesh.toolargs import ArgumentsSchema

__all__ = ["LEAD_SPECS", "MATE_SPECS", "MAX_TEXT_CHARS", "SCHEMAS"]

MAX_TEXT_CHARS = 20_000
_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS}
_NAME = {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,31}$",
         "description": "The teammate's name: lower-case letters, digits and '-', at most 32."}
_REQUEST = {"type": "string", "minLength": 1, "maxLength": 64, "description": "The request's id, as in sd-1a2b3c4d."}


def _spec(name: str, description: str, properties: dict[str, Any], required: list[str], read_only: bool = False) -> ToolSpec:
    return ToolSpec(name=name, description=description, read_only=read_only,
                    parameters={"type": "object", "properties": properties, "required": required,
                                "additionalProperties": False})


SEND = _spec("send_message", "Send a message to one member of your team: a teammate by name, or `lead`. It is "
             "delivered durably; the recipient sees it before its next step (or when it reads its inbox).",
             {"to": {"type": "string", "maxLength": 32}, "text": _TEXT}, ["to", "text"])
BROADCAST = _spec("broadcast", "Send the same message to every other member of your team (the lead included).",
                  {"text": _TEXT}, ["text"])
READ_INBOX = _spec("read_inbox", "The messages sent to you that you have not seen yet. When there are none it waits "
                   "for the next one, at most `wait_s` seconds (0: answer at once).",
                   {"wait_s": {"type": "number", "minimum": 0, "maximum": 600}}, [])
CHECK = _spec("check_protocol", "The state of a shutdown or plan request: pending, approved or rejected, with the "
              "answer's note.", {"request_id": _REQUEST}, ["request_id"], read_only=True)

LEAD_SPECS = (
    _spec("spawn_teammate", "Start a teammate: an agent of its own, working in parallel in its own session with "
          "your tools, that shares your task board and mailboxes. Give it a name, a role and its first task; it "
          "claims tasks from the board (task_claim), messages you and the others, and tells you when it finishes. "
          "Create the board's tasks before or after spawning; read_inbox collects what teammates send you.",
          {"name": _NAME, "role": {"type": "string", "minLength": 1, "maxLength": 400}, "task": _TEXT},
          ["name", "role", "task"]),
    _spec("list_teammates", "Your teammates: each one's state (started, working, idle, finished), current task, "
          "last message and tokens used.", {}, [], read_only=True),
    SEND, BROADCAST, READ_INBOX,
    _spec("shutdown_request", "Ask a teammate to stop. It answers (approve or not, with a note) and exits when it "
          "approves; check_protocol tells you the answer.", {"name": _NAME}, ["name"]),
    _spec("plan_review", "Answer a teammate's plan (a submit_plan request in your inbox): approve it, or reject it "
          "with a note saying what to change; the teammate proceeds or revises.",
          {"request_id": _REQUEST, "approve": {"type": "boolean"},
           "note": {"type": "string", "maxLength": MAX_TEXT_CHARS}}, ["request_id", "approve"]),
    CHECK,
)

MATE_SPECS = (
    SEND, BROADCAST, READ_INBOX,
    _spec("submit_plan", "Submit your plan to the lead before you carry it out. The lead approves it or rejects it "
          "with a note; the answer arrives in your inbox (check_protocol tells its state). Wait for it.",
          {"plan": _TEXT}, ["plan"]),
    _spec("shutdown_response", "Answer the lead's shutdown request: approve to stop once this reply is done (say "
          "what you finished first), or decline with a note saying why not yet.",
          {"request_id": _REQUEST, "approve": {"type": "boolean"},
           "note": {"type": "string", "maxLength": MAX_TEXT_CHARS}}, ["request_id", "approve"]),
    CHECK,
)

SCHEMAS = {s.name: ArgumentsSchema(s.name, s.parameters) for s in (*LEAD_SPECS, *MATE_SPECS)}
