"""`agentmesh chat`: stream one turn (or a REPL of turns) and show its events.

This module is the command's arguments and how a turn's end becomes the exit code; the turn
itself, with gRPC and the stubs, is in chat_turns.py, imported when the command runs — so
`agentmesh chat --help` answers without loading them (main.py).
"""

from __future__ import annotations

import argparse

from agentmesh.cli.common import EXIT_INTERRUPTED, EXIT_LIMIT, EXIT_OK, EXIT_SERVER_ERROR, CliError


def register(subparsers) -> None:
    chat = subparsers.add_parser("chat", help="stream one turn of a session (a REPL without MESSAGE)")
    chat.add_argument("message", nargs="?", help="the user's message; omit it for an interactive session")
    chat.add_argument("--session", help="session id (created when new; default: a fresh session)")
    chat.add_argument("--json", action="store_true", help="print one JSON event per line")
    chat.add_argument("--max-iterations", type=_steps, default=0, help="cap on model calls in this turn")
    chat.add_argument("--model", default="", help="override the configured model for this turn")
    chat.add_argument("--agent", default="", metavar="NAME[@VERSION]",
                      help="run a named agent of the session's namespace (agentmesh agents list)")
    chat.add_argument("--mode", choices=("default", "deep"), default="",
                      help="run mode: deep plans first, reflects on the plan, has a larger step budget and sub-agents")
    chat.add_argument("--require-approval", action="append", default=[], metavar="TOOL",
                      help="also hold calls to TOOL for approval in this turn ('*': every tool); repeatable")
    chat.add_argument("--plan", action="store_true",
                      help="plan mode: the agent writes a plan and waits for your approval before anything runs")
    chat.add_argument("--token-budget", type=_budget, default=0, metavar="TOKENS",
                      help="stop this turn cleanly (stop_reason budget) once it has used this many tokens")
    chat.add_argument("--session-token-budget", type=_budget, default=0, metavar="TOKENS",
                      help="stop once the session as a whole has used this many tokens")
    chat.add_argument("--attach", metavar="SESSION", default="",
                      help="follow the session's running turn from its start to its end (after a dropped "
                           "connection, or a turn another client started); Ctrl-C cancels it")
    chat.add_argument("--permission-mode", choices=("auto", "normal", "manual"), default="",
                      help="which tool calls this turn holds for approval: none (auto), every tool not marked "
                           "read-only (normal), every call (manual); default: the session's (/mode in the REPL)")
    chat.add_argument("--allow-tool", action="append", default=[], metavar="TOOL",
                      help="offer only these tools in this turn (within what the session allows); repeatable")
    chat.add_argument("--deny-tool", action="append", default=[], metavar="TOOL",
                      help="do not offer this tool in this turn; repeatable")
    chat.add_argument("--image", action="append", default=[], metavar="FILE",
                      help="show the agent this image (PNG, JPEG, GIF or WebP) with the message; repeatable")
    chat.add_argument("--if-busy", choices=("reject", "enqueue", "interrupt", "rollback"), default="",
                      help="if the session is already running a turn: refuse (reject), wait for it (enqueue), "
                           "stop it and go on from its finished steps (interrupt), or stop it and remove its "
                           "steps (rollback); default: the gateway's AGENTMESH_GATEWAY_IF_BUSY")
    chat.add_argument("--submit", action="store_true",
                      help="start the turn as a run that goes on without this client: print its id and exit "
                           "(follow it with `agentmesh runs join RUN_ID`)")
    chat.set_defaults(func=run_chat)


def _budget(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a token budget is a positive number of tokens (0: the configured one)")
    return value


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of model calls") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a cap on model calls is 0 (the configured one) or more")
    return value


# How a turn's end becomes the exit code (docs/architecture.md, "The command line"). A turn that
# stopped at a limit ended cleanly but short of an answer: a script should be able to tell.
LIMIT_STOPS = ("max_iterations", "budget")
# Ended early by someone else: cancelled or interrupted from another client, or its steps rolled back.
ENDED_ELSEWHERE = ("cancelled", "interrupted", "rolled_back")


def turn_exit_code(stop_reason: str | None, failed: bool, cancel_asked: bool) -> int:
    """The exit code of a turn: `stop_reason` of its run_finished (None: none came), `failed`
    when an error event came, `cancel_asked` when Ctrl-C asked to cancel it here."""
    if cancel_asked:
        return EXIT_INTERRUPTED
    if failed or stop_reason in ENDED_ELSEWHERE:
        return EXIT_SERVER_ERROR
    if stop_reason is None:
        raise CliError("the turn's stream ended before the turn did (no run_finished); "
                       "see `agentmesh sessions show` for what was saved")
    return EXIT_LIMIT if stop_reason in LIMIT_STOPS else EXIT_OK


def parse_answer(answer: str) -> tuple[bool, str, bool]:
    """"y"/"yes" approves; "a"/"all" approves this call and the rest of the turn; "n REASON"/"no
    REASON" denies with REASON; any other text denies with that text as the note (so "not on prod
    please" says why). (approved, note, rest_of_turn)."""
    text = answer.strip()
    if text.lower() in ("y", "yes"):
        return True, "", False
    if text.lower() in ("a", "all"):
        return True, "", True
    first, _, rest = text.partition(" ")
    return False, rest.strip() if first.lower() in ("n", "no") else text, False


# Written (on stderr) once the turn runs at the gateway: a line typed from then on interrupts it.
READY_TO_INTERRUPT = "· working — type to interrupt, Ctrl-C to cancel"


async def run_chat(args) -> int:
    from agentmesh.cli.chat_turns import chat

    return await chat(args)
