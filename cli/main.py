"""The `agentmesh` command line. Exit codes (common.py): 0 success, 1 a server error, 2 a usage error,
3 a turn stopped at its step or token limit, 130 interrupted.

It answers at once: a command's module (and with it gRPC, protobuf, the settings) is imported only
when that command runs or shows its own help, so `agentmesh --help` imports none of them.
`tests/cli/test_cli_startup.py` keeps it so; `benches/cli_startup.py` times it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from agentmesh.cli.common import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError

# Every command: the module that adds its parser with `register(subparsers)` and runs it (its
# handlers are async and return the exit code), and the one line `agentmesh --help` shows for it
# without importing that module. The lines are the ones each module registers
# (tests/cli/test_cli_startup.py checks they agree); the order is the help's.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("stack", "run one service in the foreground (what a container runs)"),
    "up": ("stack", "run all five services locally; Ctrl-C stops them all"),
    "demo": ("demo", "start the stack, run a scripted tool-and-memory task, stop"),
    "chat": ("chat", "stream one turn of a session (a REPL without MESSAGE)"),
    "sessions": ("sessions", "list, show, search, fork or delete sessions"),
    "tasks": ("tasks", "a session's task board"),
    "team": ("team", "a lead session's teammates: show, message, stop"),
    "tools": ("tools", "list tools or run one in the sandbox"),
    "sandbox": ("sandbox", "the deployment's sandbox templates; a namespace's choice"),
    "memory": ("memory", "add, search, import or forget long-term memories; the memory blocks"),
    "profile": ("profile", "standing instructions: a namespace's soul, user and project texts"),
    "skills": ("skills", "add, list, show or remove a namespace's skills (SKILL.md folders)"),
    "reflect": ("reflect", "reflect on a session now (knowledge, learnings, skill drafts); 'history' lists the runs"),
    "cron": ("cron", "schedule agent runs: add, list, run, toggle, delete, history, import, apply, cancel-wakeup"),
    "trace": ("trace", "show the traces of recent turns (local span store)"),
    "runs": ("runs", "list, show, join or cancel runs (turns started with chat --submit)"),
    "approvals": ("approvals", "approve or deny a tool call a running turn waits on"),
    "models": ("models", "the models a turn may name (chat --model NAME)"),
    "mcp": ("mcp", "a namespace's own MCP servers: add, list, remove"),
    "login": ("login", "store your token for the CLI (mode 0600)"),
    "logout": ("login", "forget the stored token"),
    "usage": ("usage", "token usage and estimated cost of model calls"),
    "activity": ("activity", "watch the tool calls of every running turn, live"),
    "agents": ("agents", "define, list, version and roll back a namespace's named agents"),
    "export": ("export", "write a namespace (settings, instructions, memory blocks, skills, agents, memories, "
               "transcripts, jobs) as JSON Lines to stdout"),
    "import": ("export", "read an export into a namespace; refuses to overwrite anything without --replace"),
}
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one plain line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"agentmesh: {message}\n")
        sys.exit(EXIT_USAGE)


def _command_of(argv: list[str]) -> str:
    """The command `argv` names: its first word that is not an option ("" for none). The
    top-level parser has no option that takes a value, so that word is the command."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: the named command's module registers its real parser, every other
    command is listed by name and help line alone. Without `argv`, every module registers its
    own (the whole command line, for tests and docs)."""
    parser = _Parser(prog="agentmesh", description="Run tool-using LLM agents as gRPC services.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    wanted = None if argv is None else COMMANDS.get(_command_of(argv), ("", ""))[0]
    registered: set[str] = set()
    for name, (module, help_line) in COMMANDS.items():
        if wanted is not None and module != wanted:
            subparsers.add_parser(name, help=help_line, add_help=False)
        elif module not in registered:  # a module registers all its commands at once
            registered.add(module)
            importlib.import_module(f"agentmesh.cli.{module}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    # asyncio is imported here, not above: `--help` and usage errors exit before this line.
    import asyncio

    try:
        return asyncio.run(args.func(args))
    except CliError as exc:
        sys.stderr.write(f"agentmesh: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`agentmesh tools list | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
