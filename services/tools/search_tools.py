"""`glob` and `grep` over the session workspace, in the service itself.

Walks never follow symlinks (a link to / cannot widen the search), visit a bounded number of
entries, and grep's regular expressions run with a per-file timeout (the `regex` module), so a
pathological pattern cannot hold a service thread.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import time
from pathlib import PurePosixPath
from typing import Any, Callable, Iterator

import regex

from agentmesh.tools.beneath import open_beneath, walk_beneath
from agentmesh.tools.catalog import CallContext, Tool, ToolSpec, obj, string
from agentmesh.tools.results import ToolFailure, ToolOutcome
from agentmesh.tools.workspace import Workspaces, display_path

MAX_VISITED = 50_000
MAX_GLOB_MATCHES = 1000
MAX_GREP_MATCHES = 500
MAX_GREP_FILE_BYTES = 4 * 1024 * 1024
MAX_LINE_CHARS = 500
# All regex matching in one grep call shares this budget.
REGEX_BUDGET_S = 2.0


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Translate a glob with `**` (any number of directories), `*`, `?` and `[...]` to a regex."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


class SearchTools:
    def __init__(self, workspaces: Workspaces):
        self._workspaces = workspaces

    def tools(self) -> list[Tool]:
        return [
            Tool(
                ToolSpec(
                    "glob",
                    "Find workspace files whose path matches a glob pattern, e.g. '**/*.py' or 'src/*.txt'.",
                    obj({"pattern": string("Glob pattern relative to the workspace; '**' spans directories.", 1000, 1)}, ["pattern"]), read_only=True),
                self.glob,
            ),
            Tool(
                ToolSpec(
                    "grep",
                    "Search workspace files for a regular expression; prints path:line: text for each match.",
                    obj(
                        {
                            "pattern": string("A regular expression (Python syntax).", 1000, 1),
                            "path": string("File or directory to search, relative to the workspace. Default '.'."),
                        },
                        ["pattern"],
                    ), read_only=True),
                self.grep,
            ),
        ]

    async def glob(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        return await asyncio.to_thread(self._glob, ctx.session_id, args["pattern"])

    def _glob(self, session_id: str, pattern: str) -> ToolOutcome:
        parts = PurePosixPath(pattern).parts
        if pattern.startswith("/") or ".." in parts:
            raise ToolFailure("path_escape", f"glob pattern {pattern!r} must stay inside the workspace: no leading '/' and no '..'")
        workspace = self._workspaces.ensure(session_id)
        matcher = glob_to_regex(pattern.removeprefix("./"))
        matches: list[str] = []
        truncated = False
        for entry in walk_beneath(workspace, workspace, max_entries=MAX_VISITED):
            if matcher.match(entry.path):
                if len(matches) >= MAX_GLOB_MATCHES:
                    truncated = True
                    break
                matches.append(entry.path + ("/" if entry.kind == "dir" else ""))
        text = "\n".join(matches) if matches else f"no files match {pattern!r}"
        if truncated:
            text += f"\n[... stopped at {MAX_GLOB_MATCHES} matches ...]"
        return ToolOutcome(output=text, truncated=truncated, data={"pattern": pattern, "matches": matches})

    async def grep(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        return await asyncio.to_thread(self._grep, ctx.session_id, args["pattern"], args.get("path", "."))

    def _grep(self, session_id: str, pattern: str, user_path: str) -> ToolOutcome:
        try:
            compiled = regex.compile(pattern, regex.VERSION0)
        except regex.error as exc:
            raise ToolFailure("invalid_arguments", f"the pattern is not a valid regular expression: {exc}") from None
        workspace, real = self._workspaces.resolve(session_id, user_path)
        try:
            info = os.stat(real, follow_symlinks=False)
        except FileNotFoundError:
            raise ToolFailure("not_found", f"{display_path(workspace, real)} does not exist in the workspace") from None
        matches: list[dict[str, Any]] = []
        truncated = timed_out = False
        deadline = time.monotonic() + REGEX_BUDGET_S
        if stat.S_ISDIR(info.st_mode):
            base = display_path(workspace, real)
            files: Iterator[tuple[Callable[[], int], str]] = (
                (entry.open, entry.path if base == "." else f"{base}/{entry.path}")
                for entry in walk_beneath(workspace, real, max_entries=MAX_VISITED)
                if entry.kind == "file"
            )
        else:
            files = iter([(lambda: open_beneath(workspace, real, os.O_RDONLY), display_path(workspace, real))])
        for opener, shown in files:
            try:
                found = _search_file(opener, compiled, MAX_GREP_MATCHES - len(matches), deadline)
            except TimeoutError:
                timed_out = True
                break
            matches += [{"path": shown, "line": n, "text": t} for n, t in found]
            if len(matches) >= MAX_GREP_MATCHES:
                truncated = True
                break
        lines = [f"{m['path']}:{m['line']}: {m['text']}" for m in matches]
        if truncated:
            lines.append(f"[... stopped at {MAX_GREP_MATCHES} matches ...]")
        if timed_out:
            if not matches:
                raise ToolFailure("timeout", f"the pattern took longer than {REGEX_BUDGET_S:g} s to match; simplify it")
            lines.append(f"[... search stopped after {REGEX_BUDGET_S:g} s; simplify the pattern or narrow the path ...]")
        text = "\n".join(lines) if lines else f"no matches for {pattern!r}"
        return ToolOutcome(output=text, truncated=truncated or timed_out, data={"matches": matches})


def _search_file(opener: Callable[[], int], compiled: Any, budget: int, deadline: float) -> list[tuple[int, str]]:
    try:
        fd = opener()
    except (OSError, ToolFailure):
        return []  # gone, or swapped for a symlink meanwhile: not followed
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_GREP_FILE_BYTES)
    if b"\x00" in data[:8192]:
        return []
    text = data.decode("utf-8", errors="replace")
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if compiled.search(line, timeout=remaining):
            found.append((number, line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "…"))
            if len(found) >= budget:
                break
    return found
