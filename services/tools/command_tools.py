"""Tools that run a model-written program: `shell` and `python`, each call in a fresh sandbox — or,
with session sandboxes (`kernel`), a fresh process in the session's jail, and `python` cells in
the session's persistent interpreter."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from typing import TYPE_CHECKING, Any

from agentmesh.tools.catalog import CallContext, Tool, ToolSpec, boolean, number, obj, string
from agentmesh.tools.results import ToolFailure, ToolOutcome
from agentmesh.tools.sandbox.base import CommandResult, CommandSpec, Executor, SandboxUnavailable, SessionKernel
from agentmesh.tools.settings import SandboxLimits

if TYPE_CHECKING:
    from agentmesh.tools.cell_images import CellImages
    from agentmesh.tools.sandbox.per_template import TemplateSandboxes

# What programs print when they find no network: name resolution (libc, curl, git, pip, npm,
# Node) and connecting (errno texts, Python's and requests' wording).
OFFLINE = re.compile(
    r"Temporary failure in name resolution|Could not resolve host|Name or service not known|"
    r"getaddrinfo (?:ENOTFOUND|EAI_AGAIN)|EAI_AGAIN|Network is unreachable|No route to host|"
    r"Failed to establish a new connection|nodename nor servname|Could not resolve hostname|"
    r"unable to access '[^']*': Could not resolve", re.IGNORECASE)
MAX_COMMAND_CHARS = 100_000  # argv strings are capped by the kernel at 128 KiB each


def program_text(args: dict[str, Any], key: str) -> str:
    """A command or program as the model wrote it, refused when it holds a NUL: an argv string
    ends at the first NUL, so no program could receive it (and spawning would fail)."""
    text: str = args[key]
    if "\x00" in text:
        raise ToolFailure("invalid_arguments", f"{key} contains a NUL character (\\u0000, at position "
                          f"{text.index(chr(0))}), which no program can receive in its arguments; remove it")
    return text


class CommandTools:
    def __init__(self, executor: Executor, limits: SandboxLimits, network: bool = False, max_concurrent: int = 32,
                 kernel: SessionKernel | None = None, sandboxes: TemplateSandboxes | None = None,
                 cell_images: CellImages | None = None):
        self._executor = executor
        # A cell's figures read back as images of its result (None: only named in its text).
        self._cell_images = cell_images
        self._kernel = kernel
        # The deployment's templates: a call naming one runs in that template's executor.
        self._sandboxes = sandboxes
        self._limits = limits
        self._network = network
        # Bounds the jails (or Jobs) one replica runs at once, so a burst of calls queues here
        # instead of overcommitting the machine or the namespace's quota.
        self._slots = asyncio.Semaphore(max_concurrent)

    def tools(self) -> list[Tool]:
        timeout = number(
            f"Wall-clock limit in seconds (default {self._limits.default_timeout_s:g}, at most {self._limits.max_timeout_s:g}).",
            0,
            self._limits.max_timeout_s,
        )
        python = Tool(
            ToolSpec(
                "python",
                "Run a Python 3 program (python3 -c) in an isolated sandbox whose working directory is the "
                "session workspace (/workspace). No network. Print what you want to see.",
                obj({"code": string("The Python source.", MAX_COMMAND_CHARS, 1), "timeout_s": timeout}, ["code"]),
                runs_code=True,
            ),
            self.python,
        )
        if self._kernel is not None:
            python = Tool(
                ToolSpec(
                    "python",
                    "Run Python 3 code in this session's persistent interpreter, in an isolated sandbox whose "
                    "working directory is the session workspace (/workspace). No network. Variables, imports and "
                    "loaded data stay for later calls (until `restart`, or the sandbox idles out); the value of a "
                    "last bare expression is shown (a pandas DataFrame as a table, also saved as CSV under .outputs/); "
                    "matplotlib figures are saved under .outputs/ as PNG files and shown to you as images. "
                    "A cell past its time limit is interrupted (KeyboardInterrupt) and the variables stay.",
                    obj({"code": string("The Python source.", MAX_COMMAND_CHARS),
                         "restart": boolean("Start a fresh interpreter (all variables cleared) before running code."),
                         "timeout_s": timeout}, []),
                    runs_code=True,
                ),
                self.python,
            )
        return [
            Tool(
                ToolSpec(
                    "shell",
                    "Run a shell command (/bin/sh -c) in an isolated sandbox whose working directory is the "
                    "session workspace (/workspace). No network. Returns exit code, stdout and stderr.",
                    obj({"command": string("The shell command line.", MAX_COMMAND_CHARS, 1), "timeout_s": timeout}, ["command"]),
                    runs_code=True,
                ),
                self.shell,
            ),
            python,
        ]

    def _offline_hint(self, ctx: CallContext, egress: bool, outcome: ToolOutcome) -> ToolOutcome:
        """A failed call that looks like it wanted the network, in a sandbox without one, says
        which template (or setting) would allow it."""
        if egress or self._network or not outcome.is_error or not OFFLINE.search(outcome.stdout + outcome.stderr):
            return outcome
        name = ctx.sandbox_template or "default"
        egress_templates = [t.name for t in self._sandboxes.templates.all() if t.egress] if self._sandboxes else []
        choice = (f"a template with `network: egress` would allow it: {', '.join(egress_templates)} (chosen for the "
                  "agent, the session or the namespace)" if egress_templates else
                  "this deployment defines no template with `network: egress`; one in AGENTMESH_SANDBOX_TEMPLATES "
                  "(Helm: sandbox.templates) would allow it")
        outcome.output += f"\n[the sandbox has no network (template {name!r}, network: none); {choice}]"
        outcome.data["network"] = "none"
        return outcome

    def _sandbox(self, ctx: CallContext) -> tuple[Executor, SessionKernel | None, bool]:
        """The call's executor, its session sandboxes (None: a fresh sandbox per call), and
        whether its template has egress."""
        if self._sandboxes is None or not (ctx.sandbox_template or ctx.isolation):
            return self._executor, self._kernel, False
        template = self._sandboxes.template(ctx.sandbox_template)
        if ctx.isolation and ctx.isolation != template.isolation:
            template = dataclasses.replace(template, isolation=ctx.isolation)
        return self._sandboxes.executor(template), self._sandboxes.kernel(template), template.egress

    async def shell(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        return await self._run(ctx, ("/bin/sh", "-c", program_text(args, "command")), args.get("timeout_s"))

    async def python(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        if self._sandbox(ctx)[1] is not None:
            return await self._cell(ctx, args)
        if args.get("code") is None:
            raise ToolFailure("invalid_arguments", "give `code` to run")
        return await self._run(ctx, ("python3", "-c", program_text(args, "code")), args.get("timeout_s"))

    async def _cell(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        _, kernel, egress = self._sandbox(ctx)
        assert kernel is not None
        code = program_text(args, "code") if args.get("code") is not None else ""
        if args.get("restart"):
            await kernel.restart_kernel(ctx.session_id)
            if not code.strip():
                return ToolOutcome(output="The Python interpreter was restarted: every variable is cleared.")
        elif not code.strip():
            raise ToolFailure("invalid_arguments", "give `code` to run (or `restart: true` to clear the interpreter)")
        timeout = self.effective_timeout(args.get("timeout_s"), ctx.caller_timeout_s)
        spec = CommandSpec(session_id=ctx.session_id, call_id=ctx.call_id, argv=(), timeout_s=timeout,
                           network=self._network or egress, egress=egress, tenant=ctx.tenant, namespace=ctx.namespace)
        try:
            cell = await kernel.run_cell(spec, code)
        except SandboxUnavailable as exc:
            return ToolOutcome(output=str(exc), is_error=True, error_kind="sandbox_unavailable")
        outcome = self._offline_hint(ctx, egress, command_outcome(cell.result))
        if cell.tables:
            outcome.output += "\n[table saved as CSV: " + ", ".join(cell.tables) + "]"
            outcome.data["tables"] = cell.tables
        if cell.figures:
            outcome.output += "\n[figures saved: " + ", ".join(cell.figures) + "]"
            outcome.data["figures"] = cell.figures
            if self._cell_images is not None:
                images, notes = await asyncio.to_thread(self._cell_images.read, ctx.session_id, cell.figures)
                outcome.images = images
                outcome.output += "".join("\n" + note for note in notes)
        return outcome

    def effective_timeout(self, requested: float | None, caller: float) -> float:
        timeout = float(requested) if requested else self._limits.default_timeout_s
        if caller and caller > 0:
            timeout = min(timeout, caller)
        return min(timeout, self._limits.max_timeout_s)

    async def _run(self, ctx: CallContext, argv: tuple[str, ...], requested_timeout: float | None) -> ToolOutcome:
        timeout = self.effective_timeout(requested_timeout, ctx.caller_timeout_s)
        executor, _, egress = self._sandbox(ctx)
        started = time.monotonic()
        try:
            if self._slots.locked():  # only then wait, under the call's time limit (a task more)
                await asyncio.wait_for(self._slots.acquire(), timeout=timeout)
            else:
                await self._slots.acquire()  # free: taken at once
        except TimeoutError:
            return ToolOutcome(
                output=f"[every sandbox of this service was busy for the call's whole {timeout:g} s time limit; try again]",
                is_error=True,
                error_kind="timeout",
                exit_code=-1,
            )
        try:
            # Time spent waiting for a slot comes out of the call's own budget.
            remaining = max(timeout - (time.monotonic() - started), 0.1)
            spec = CommandSpec(session_id=ctx.session_id, call_id=ctx.call_id, argv=argv, timeout_s=remaining,
                               network=self._network or egress, egress=egress, tenant=ctx.tenant,
                               namespace=ctx.namespace)
            result = await executor.run(spec)
        except SandboxUnavailable as exc:
            return ToolOutcome(output=str(exc), is_error=True, error_kind="sandbox_unavailable")
        finally:
            self._slots.release()
        return self._offline_hint(ctx, egress, command_outcome(result))


def command_outcome(result: CommandResult) -> ToolOutcome:
    """The model's view of a finished command: its output, then what went wrong if anything did."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    error_kind = result.error_kind
    if error_kind:
        parts.append(f"[{result.detail}]")
    elif result.exit_code != 0:
        error_kind = "nonzero_exit"
        parts.append(f"[exit code {result.exit_code}]")
    output = "\n".join(parts) if parts else "(no output)"
    return ToolOutcome(
        output=output,
        is_error=bool(error_kind),
        error_kind=error_kind,
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        truncated=result.truncated,
        duration_ms=result.duration_ms if math.isfinite(result.duration_ms) else 0.0,
        data=dict(result.data),
    )
