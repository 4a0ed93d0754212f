"""Self-made tools: `promote_skill(path, function, tool_name)` turns a Python function the agent
wrote in its workspace into a tool of the namespace.

Promoting reads the file from the workspace (through the tools service, in the sandbox), checks
it and derives the argument schema from the signature by reading its syntax tree (toolmaker.py —
nothing is imported or run), and stores it with the memory service as a new version. From the
next step on the tool is in the turn's catalog; every later turn of the namespace lists it too
(it is stored, so it survives restarts), and no other namespace ever sees it.

Calling a promoted tool: its arguments are checked against the derived schema here; then a small
runner — the stored source, the arguments and the call — goes to the tools service's `python`
tool, so the function runs in the session's sandbox (jail or pod), never in a service process.

What a self-made tool may not do (docs/security.md, "Self-made tools"):
- run where running code is off: it is code the model wrote, so promoting or calling one needs
  every layer of the tool policy to allow `shell` and `python` (toolpolicy.CODE_TOOLS) — else
  refused with a sentence naming the policy;
- take another tool's name: not one of the tools service's catalogue (built-in, MCP, remote
  agents — the whole catalogue, not what the policies leave the turn), not one of the agent's
  own (toolpolicy.AGENT_TOOLS), not an MCP-style `server__tool`. Checked when it is promoted and
  again whenever the turn's catalogue is assembled, where one stored before is left out with a
  warning: a self-made `shell` would otherwise stand in for the real one in every session.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any, Protocol

from agentmesh.agent.capabilities import subagents, toolmaker
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import StatusEvent, ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.toolargs import ArgumentsSchema
from agentmesh.toolpolicy import AGENT_TOOLS, runs_code_allowed

log = get_logger("agentmesh.agent.promoted_tools")

PROMOTE = "promote_skill"
TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# The runner is one `python3 -c` argument: the kernel caps one at 128 KiB, the tools service at 100k.
MAX_SOURCE_CHARS = 32_000
NO_CODE = ("the tool policy of this deployment, namespace, session or turn turns off running code "
           "(shell, python)")

PROMOTE_SPEC = ToolSpec(
    name=PROMOTE,
    description=(
        "Turn a Python function you wrote in the workspace into a tool you (and later sessions of this namespace) "
        "can call from the next step on. The function needs type hints on every parameter and the return value "
        "(str, int, float, bool, list[T], dict[str, T], Optional[T], Literal[...]) and a docstring, which becomes "
        "the tool's description. It runs in the sandbox; print nothing, return the result (JSON-serialisable)."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "maxLength": 512, "description": "The .py file in the workspace."},
            "function": {"type": "string", "minLength": 1, "maxLength": 128, "description": "The function's name."},
            "tool_name": {"type": "string", "minLength": 1, "maxLength": 64,
                          "description": "The new tool's name: a-z, 0-9 and '_', starting with a letter."},
        },
        "required": ["path", "function", "tool_name"],
        "additionalProperties": False,
    },
)
_PROMOTE_SCHEMA = ArgumentsSchema(PROMOTE, PROMOTE_SPEC.parameters)

RUNNER = """\
import json, sys, types
module = types.ModuleType({module!r})
sys.modules[module.__name__] = module
exec(compile({source!r}, {filename!r}, "exec"), module.__dict__)
result = getattr(module, {function!r})(**json.loads({arguments!r}))
try:
    print(json.dumps(result))
except (TypeError, ValueError):
    print(repr(result))
"""


@dataclass(frozen=True)
class StoredTool:
    name: str
    description: str
    parameters: dict[str, Any]
    source: str
    function: str
    version: int


class PromotedToolStore(Protocol):
    async def list(self, namespace: str) -> list[StoredTool]:
        """The namespace's promoted tools (latest version of each); raises an AgentmeshError."""
        ...

    async def put(self, namespace: str, tool: StoredTool, origin: str) -> StoredTool:
        """Store a new version (its number filled in); raises an AgentmeshError (ResourceExhausted at the cap)."""
        ...


class PromotedTools(Capability):
    def __init__(self, ctx: TurnContext, store: PromotedToolStore):
        super().__init__(ctx)
        self._store = store
        self._tools: dict[str, tuple[StoredTool, ArgumentsSchema]] = {}
        self._ignored: set[str] = set()  # stored tools left out for a taken name (said once a turn)

    def _add(self, tool: StoredTool) -> None:
        self._tools[tool.name] = (tool, ArgumentsSchema(tool.name, tool.parameters))

    def tools(self) -> list[ToolSpec]:
        # Asked as the catalogue is assembled, before each step: a stored tool whose name another
        # tool has is left out here, so the loop never lets it stand in for that tool.
        offered = [PROMOTE_SPEC]
        for name, (tool, _) in list(self._tools.items()):
            taken = self._taken(name)
            if taken is None:
                offered.append(ToolSpec(tool.name, tool.description, tool.parameters))
                continue
            del self._tools[name]
            if name not in self._ignored:
                self._ignored.add(name)
                log.warning("a self-made tool has a taken name; ignored", tool=name, reason=taken)
                self.ctx.emit(StatusEvent(f"the self-made tool {name!r} is ignored: {taken}; remove it "
                                          f"(`agentmesh skills remove {name} --tool`)"))
        return offered

    def _taken(self, name: str) -> str | None:
        """Why a self-made tool may not be called `name` (another tool has it); None: it may."""
        if "__" in name:
            return "names with '__' are MCP servers' tools (server__tool)"
        if name in AGENT_TOOLS:
            return f"{name!r} is one of the agent's own tools"
        if self.ctx.catalog is not None and any(spec.name == name for spec in self.ctx.catalog):
            return f"{name!r} is the name of a tool of this deployment"
        return None

    async def load(self) -> None:
        try:
            async with asyncio.timeout(self.ctx.settings.recall_timeout_s):
                stored = await self._store.list(self.ctx.request.namespace)
        except (AgentmeshError, TimeoutError) as exc:
            reason = exc.message if isinstance(exc, AgentmeshError) else "it took too long"
            log.warning("promoted tools unavailable", error=reason)
            self.ctx.emit(StatusEvent(f"could not list the namespace's promoted tools ({reason}); continuing without them"))
            return
        for tool in stored:
            try:
                self._add(tool)
            except Exception:
                log.exception("a stored promoted tool has an unusable schema", tool=tool.name)

    async def execute(self, call: ToolCall) -> ToolOutcome:
        # A self-made tool is code the model wrote: where the policy turns code off, neither made nor run.
        code_off = not runs_code_allowed(self.ctx.request.tool_policies)
        if call.name == PROMOTE:
            return _refused(call, f"a self-made tool runs code, and {NO_CODE}") if code_off else await self._promote(call)
        if code_off:
            return ToolOutcome.error(call, "not_allowed", f"error: {call.name} was not run: it is a self-made tool, "
                                     f"which runs code, and {NO_CODE}")
        return await self._run(call)

    # --- promote_skill ----------------------------------------------------------------------

    async def _promote(self, call: ToolCall) -> ToolOutcome:
        try:
            args = _PROMOTE_SCHEMA.parse(call.arguments_json)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        path, function, name = args["path"], args["function"], args["tool_name"]
        if not TOOL_NAME.match(name):
            return _refused(call, f"{name!r} is not a tool name: use a-z, 0-9 and '_', starting with a letter")
        # Against every tool there is, not the ones the policies offer this turn: a name a policy
        # hides now would be shadowed by this one the day the policy changes.
        if (taken := self._taken(name)) is not None:
            return _refused(call, f"{taken}; a self-made tool may not take it (choose another name)")
        if self.ctx.catalog is None:
            return _refused(call, "the tools service's catalogue could not be read this turn, so whether the name "
                                  f"{name!r} is taken cannot be checked; try again in a later turn")
        read = await self._sandboxed(call, "shell", {"command": f"cat -- {shlex.quote(path)}"}, "read")
        if read.is_error:
            return _refused(call, f"could not read {path}: {read.output}")
        source = read.stdout
        if read.truncated or len(source) > MAX_SOURCE_CHARS:
            return _refused(call, f"{path} is over {MAX_SOURCE_CHARS} characters; a promoted tool must be smaller")
        try:
            made = toolmaker.describe(source, function)
        except toolmaker.ToolRefused as exc:
            return _refused(call, str(exc))
        tool = StoredTool(name=name, description=made.description, parameters=made.parameters, source=source,
                          function=function, version=0)
        try:
            stored = await self._store.put(self.ctx.request.namespace, tool, origin=f"{self.ctx.request.session_id}:{path}")
        except AgentmeshError as exc:
            return _refused(call, exc.message)
        self._add(stored)
        self.ctx.emit(StatusEvent(f"promoted {function} in {path} to the tool {name} (version {stored.version})"))
        return ToolOutcome(
            call_id=call.call_id, name=call.name,
            output=(f"{name} is now a tool (version {stored.version}), callable from your next step, with these "
                    f"arguments: {json.dumps(made.parameters, separators=(',', ':'))}"),
            data={"tool": name, "version": stored.version, "parameters": made.parameters},
        )

    # --- calling a promoted tool ------------------------------------------------------------

    async def _run(self, call: ToolCall) -> ToolOutcome:
        tool, schema = self._tools[call.name]
        try:
            arguments = schema.parse(call.arguments_json)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        code = RUNNER.format(module=f"promoted_{tool.name}", source=tool.source, filename=f"{tool.name}.py",
                             function=tool.function, arguments=json.dumps(arguments))
        ran = await self._sandboxed(call, "python", {"code": code}, "run")
        if ran.is_error:
            return ToolOutcome(call_id=call.call_id, name=call.name, output=ran.output, is_error=True,
                               error_kind=ran.error_kind or "tool_error", exit_code=ran.exit_code,
                               stdout=ran.stdout, stderr=ran.stderr, data={"version": tool.version})
        return ToolOutcome(call_id=call.call_id, name=call.name, output=ran.stdout.strip(), stdout=ran.stdout,
                           stderr=ran.stderr, duration_ms=ran.duration_ms, data={"version": tool.version})

    async def _sandboxed(self, call: ToolCall, tool: str, arguments: dict[str, Any], purpose: str) -> ToolOutcome:
        """One call of the tools service's `tool`, in the session's sandbox."""
        return await self.ctx.agent.tools.execute(
            subagents.workspace_of(self.ctx.request),
            ToolCall(call_id=f"{call.call_id}-{purpose}", name=tool, arguments_json=json.dumps(arguments)),
        )


def _refused(call: ToolCall, why: str) -> ToolOutcome:
    return ToolOutcome.error(call, "refused", f"error: promote_skill refused: {why}")
