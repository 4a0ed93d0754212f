"""The `agentmesh` command line. Exit codes: 0 success, 1 a server error, 2 a usage error."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys

from agentmesh.cli.common import EXIT_OK, EXIT_USAGE, CliError

# Each module adds its command group with `register(subparsers)`; handlers are async and
# return the exit code.
COMMAND_MODULES = ("stack", "demo", "chat", "sessions", "tasks", "tools", "memory", "profile", "skills", "reflect", "cron",
                   "trace", "approvals", "models", "mcp", "login", "usage", "activity", "agents")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one plain line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"agentmesh: {message}\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agentmesh", description="Run tool-using LLM agents as gRPC services.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"agentmesh.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(args.func(args))
    except CliError as exc:
        sys.stderr.write(f"agentmesh: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`agentmesh tools list | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
