"""Background commands: `background_run` starts a sandboxed shell command that outlives the call
and answers at once with an id; `background_check` reports on one or all of the session's
commands. Same executor (jail or pod), limits and workspace as `shell`.

Bounds: at most `max_per_session` commands running per session; each is stopped (its whole
process tree killed) when its lifetime (`max_lifetime_s`, or the shorter `timeout_s` asked for)
passes, when the session's commands are stopped (`stop_session`: the agent does this when a turn
is cancelled) or when the session's workspace is deleted. The agent collects finished commands
with `take_finished` (the `BackgroundResults` RPC) and puts their results in front of the model
at its next step, so the model never has to poll. Which sessions have something to collect (or
still running) is streamed to the agent (`sessions`, background_sessions.py; WatchBackground),
so it asks only for those.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agentmesh.logs import get_logger
from agentmesh.tools.background_sessions import BackgroundSessions
from agentmesh.tools.catalog import CallContext, Tool, ToolSpec, number, obj, string
from agentmesh.tools.command_tools import MAX_COMMAND_CHARS, command_outcome, program_text
from agentmesh.tools.results import ToolFailure, ToolOutcome
from agentmesh.tools.sandbox.base import CommandSpec, Executor, SandboxUnavailable

log = get_logger("agentmesh.tools.background")

RUNNING, FINISHED, STOPPED = "running", "finished", "stopped"


@dataclass
class BackgroundCommand:
    id: str
    session_id: str
    command: str
    started_at: float
    task: "asyncio.Task[None] | None" = None
    status: str = RUNNING
    outcome: ToolOutcome | None = None
    delivered: bool = False  # its result has been handed to the agent (or read by the model)
    finished_at: float = 0.0
    call_id: str = ""  # the executor's id of its run (for reading its output while it runs)

    def summary(self) -> str:
        elapsed = (self.finished_at or time.time()) - self.started_at
        head = f"{self.id} `{_short(self.command)}` — {self.status} after {elapsed:.0f} s"
        if self.outcome is None:
            return head
        return f"{head}, exit code {self.outcome.exit_code}:\n{self.outcome.output}"


def _short(command: str, limit: int = 80) -> str:
    line = " ".join(command.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class _Session:
    commands: dict[str, BackgroundCommand] = field(default_factory=dict)
    counter: int = 0


# (session_id, call_id) -> (stdout, stderr) so far of a command still running, or None. Session
# sandboxes can tell (sandbox/session.py); a per-call jail's output is read only at its end.
OutputPeek = Callable[[str, str], Awaitable["tuple[str, str] | None"]]


class BackgroundCommands:
    def __init__(self, executor: Executor, *, max_per_session: int, max_lifetime_s: float, network: bool = False,
                 peek: OutputPeek | None = None):
        self._executor = executor
        self._peek = peek
        self._max_per_session = max_per_session
        self._max_lifetime_s = max_lifetime_s
        self._network = network
        self._sessions: dict[str, _Session] = {}
        # The sessions with a command running or not yet handed over, for WatchBackground.
        self.sessions = BackgroundSessions()

    def _update(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        self.sessions.set(session_id, session is not None and any(
            c.status == RUNNING or not c.delivered for c in session.commands.values()))

    def tools(self) -> list[Tool]:
        lifetime = number(f"Stop it after this many seconds (at most {self._max_lifetime_s:g}, the default).",
                          0, self._max_lifetime_s)
        return [
            Tool(ToolSpec(
                "background_run",
                "Start a shell command in the background, in the same sandbox and workspace as `shell`, and get its "
                f"id at once. Use it for long builds, test runs or servers while you work on something else. At most "
                f"{self._max_per_session} run at a time per session. When it finishes, its result is shown to you at "
                "your next step: do not wait or poll for it.",
                obj({"command": string("The shell command line.", MAX_COMMAND_CHARS, 1), "timeout_s": lifetime},
                    ["command"]),
                runs_code=True,
            ), self.run),
            Tool(ToolSpec(
                "background_check",
                "Status of a background command (its output once it has finished"
                + (", and its output so far while it runs" if self._peek else "")
                + "), or of all of this session's background commands when no id is given.",
                obj({"id": string("The id background_run returned, e.g. bg-1.", 32)}, []), read_only=True), self.check),
            Tool(ToolSpec(
                "background_stop",
                "Stop a running background command (its processes are killed).",
                obj({"id": string("The id background_run returned, e.g. bg-1.", 32)}, ["id"])), self.stop),
        ]

    # --- tools --------------------------------------------------------------------------------

    async def run(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        program_text(args, "command")
        session = self._sessions.setdefault(ctx.session_id, _Session())
        running = [c for c in session.commands.values() if c.status == RUNNING]
        if len(running) >= self._max_per_session:
            raise ToolFailure("too_many_background",
                              f"{len(running)} background commands are already running in this session (the limit is "
                              f"{self._max_per_session}): wait for one to finish or work in the foreground")
        session.counter += 1
        command = BackgroundCommand(id=f"bg-{session.counter}", session_id=ctx.session_id, command=args["command"],
                                    started_at=time.time())
        command.call_id = f"{ctx.call_id}.{command.id}"
        lifetime = min(float(args.get("timeout_s") or self._max_lifetime_s), self._max_lifetime_s)
        spec = CommandSpec(session_id=ctx.session_id, call_id=command.call_id,
                           argv=("/bin/sh", "-c", command.command), timeout_s=lifetime, network=self._network,
                           tenant=ctx.tenant, namespace=ctx.namespace)
        command.task = asyncio.create_task(self._follow(command, spec), name=f"background-{ctx.session_id}-{command.id}")
        session.commands[command.id] = command
        self._update(ctx.session_id)
        log.info("background command started", session_id=ctx.session_id, id=command.id, lifetime_s=lifetime)
        # Every agent watching is told before the model hears of it, so the session's next
        # turn collects the result (whichever agent replica runs it).
        await self.sessions.settled()
        return ToolOutcome(output=f"Started {command.id} in the background (stopped after {lifetime:g} s at the "
                                  "latest). Its result will be shown to you when it finishes; carry on meanwhile.",
                           data={"id": command.id, "lifetime_s": lifetime})

    def _command(self, session_id: str, command_id: str) -> BackgroundCommand:
        session = self._sessions.get(session_id, _Session())
        command = session.commands.get(command_id)
        if command is None:
            known = ", ".join(session.commands) or "none"
            raise ToolFailure("not_found", f"there is no background command {command_id!r} in this session "
                                           f"(known: {known})")
        return command

    async def check(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        session = self._sessions.get(ctx.session_id, _Session())
        chosen = [self._command(ctx.session_id, args["id"])] if args.get("id") else list(session.commands.values())
        for c in chosen:
            if c.status != RUNNING:
                c.delivered = True
        self._update(ctx.session_id)
        parts = []
        for c in chosen:
            part = c.summary()
            if c.status == RUNNING and self._peek is not None and args.get("id"):
                so_far = await self._peek(ctx.session_id, c.call_id)
                if so_far is not None:
                    out, err = (text.rstrip("\n") for text in so_far)
                    part += ("\n[output so far]\n" + (out or "(none)")) + (f"\n[stderr so far]\n{err}" if err else "")
            parts.append(part)
        text = "\n\n".join(parts) or "No background commands in this session."
        return ToolOutcome(output=text, data={"commands": [{"id": c.id, "status": c.status} for c in chosen]})

    async def stop(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        command = self._command(ctx.session_id, args["id"])
        if command.status != RUNNING or command.task is None:
            return ToolOutcome(output=f"{command.id} is not running ({command.status}).")
        command.task.cancel()
        await asyncio.gather(command.task, return_exceptions=True)
        command.delivered = True  # the model stopped it: nothing to hand over at its next step
        self._update(ctx.session_id)
        log.info("background command stopped", session_id=ctx.session_id, id=command.id)
        return ToolOutcome(output=f"Stopped {command.id}.", data={"id": command.id})

    # --- for the agent and the service --------------------------------------------------------

    def take_finished(self, session_id: str) -> tuple[list[BackgroundCommand], int]:
        """Finished commands not yet handed over (now marked handed over), and how many still run."""
        session = self._sessions.get(session_id)
        if session is None:
            return [], 0
        done = [c for c in session.commands.values() if c.status != RUNNING and not c.delivered]
        for c in done:
            c.delivered = True
        self._update(session_id)
        return done, sum(1 for c in session.commands.values() if c.status == RUNNING)

    async def stop_session(self, session_id: str) -> int:
        """Stop every running command of the session (their process trees are killed)."""
        session = self._sessions.get(session_id)
        tasks = [c.task for c in session.commands.values() if c.status == RUNNING and c.task] if session else []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            log.info("background commands stopped", session_id=session_id, count=len(tasks))
        return len(tasks)

    async def forget_session(self, session_id: str) -> None:
        await self.stop_session(session_id)
        self._sessions.pop(session_id, None)
        self.sessions.set(session_id, False)

    async def close(self) -> None:
        for session_id in list(self._sessions):
            await self.stop_session(session_id)

    async def _follow(self, command: BackgroundCommand, spec: CommandSpec) -> None:
        try:
            outcome = command_outcome(await self._executor.run(spec))
            command.status = FINISHED
        except asyncio.CancelledError:
            command.status, command.finished_at = STOPPED, time.time()
            command.outcome = ToolOutcome(output="[stopped before it finished]", is_error=True, error_kind="stopped",
                                          exit_code=-1)
            raise
        except SandboxUnavailable as exc:
            outcome = ToolOutcome(output=str(exc), is_error=True, error_kind="sandbox_unavailable", exit_code=-1)
            command.status = FINISHED
        except Exception as exc:
            log.exception("background command failed", id=command.id)
            outcome = ToolOutcome(output=f"[the sandbox failed: {exc}]", is_error=True, error_kind="sandbox_error",
                                  exit_code=-1)
            command.status = FINISHED
        command.outcome, command.finished_at = outcome, time.time()
        log.info("background command finished", session_id=command.session_id, id=command.id,
                 exit_code=outcome.exit_code, error_kind=outcome.error_kind)
