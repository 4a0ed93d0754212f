"""How a turn's events are shown: the stable JSON of `chat --json` and the readable terminal
rendering `agentmesh chat` and `agentmesh demo` print."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from agentmesh.cli.tasks import render as render_tasks
from agentmesh.v1 import common_pb2


def _arguments(arguments_json: str) -> Any:
    try:
        return json.loads(arguments_json) if arguments_json else {}
    except json.JSONDecodeError:
        return arguments_json


def event_to_json(event: common_pb2.Event) -> dict[str, Any]:
    """The stable JSON shape of `chat --json`: one object per event, each with a `type`."""
    kind = event.WhichOneof("payload")
    base: dict[str, Any] = {"type": kind, "session_id": event.session_id, "run_id": event.run_id, "seq": event.seq}
    if kind == "run_started":
        base.update(trace_id=event.run_started.trace_id)
    elif kind == "text_delta":
        base.update(text=event.text_delta.text)
    elif kind == "reasoning_delta":
        base.update(text=event.reasoning_delta.text)
    elif kind == "background_result":
        b = event.background_result
        base.update(id=b.id, command=b.command, status=b.status, seconds=b.seconds, exit_code=b.result.exit_code,
                    output=b.result.output, error_kind=b.result.error_kind)
    elif kind == "teammate_status":
        m = event.teammate_status
        base.update(name=m.name, state=m.state, session_id=m.session_id, run_id=m.run_id, role=m.role,
                    current_task=m.current_task, last_message=m.last_message, total_tokens=m.usage.total_tokens)
    elif kind == "subagent":
        sub = event.subagent
        base.update(state=sub.state, call_id=sub.call_id, index=sub.index, depth=sub.depth, task=sub.task,
                    agent=sub.agent, agent_version=sub.agent_version, child_session_id=sub.session_id,
                    child_run_id=sub.run_id)
        if sub.state == "finished":
            base.update(stop_reason=sub.stop_reason, iterations=sub.iterations,
                        usage={"input_tokens": sub.usage.input_tokens, "output_tokens": sub.usage.output_tokens,
                               "total_tokens": sub.usage.total_tokens})
    elif kind == "task_update":
        base.update(tasks=[{"id": t.id, "subject": t.subject, "description": t.description, "status": t.status,
                            "owner": t.owner, "blocked_by": list(t.blocked_by), "blocked": t.blocked}
                           for t in event.task_update.tasks])
    elif kind == "tool_call":
        call = event.tool_call
        base.update(name=call.name, arguments=_arguments(call.arguments_json), call_id=call.call_id)
    elif kind == "approval_request":
        a = event.approval_request
        base.update(call_id=a.call_id, name=a.name, arguments=_arguments(a.arguments_json), timeout_s=a.timeout_s)
    elif kind == "approval_resolved":
        resolved = event.approval_resolved
        base.update(call_id=resolved.call_id, name=resolved.name, approved=resolved.approved, note=resolved.note,
                    decided_by=resolved.decided_by)
    elif kind == "tool_result":
        r = event.tool_result.result
        base.update(
            call_id=r.call_id,
            name=r.name,
            output=r.output,
            is_error=r.is_error,
            exit_code=r.exit_code,
            duration_ms=r.duration_ms,
            truncated=r.truncated,
            error_kind=r.error_kind,
        )
    elif kind == "run_finished":
        f = event.run_finished
        base.update(
            usage={
                "input_tokens": f.usage.input_tokens,
                "output_tokens": f.usage.output_tokens,
                "total_tokens": f.usage.total_tokens,
            },
            iterations=f.iterations,
            final_text=f.final_text,
            trace_id=f.trace_id,
            stop_reason=f.stop_reason,
        )
    elif kind == "error":
        base.update(code=event.error.code, message=event.error.message)
    elif kind == "status":
        base.update(message=event.status.message)
        if event.status.context_window:  # the turn's context-fill figure
            base.update(context_tokens=event.status.context_tokens, context_window=event.status.context_window)
    return base


class HumanRenderer:
    """Readable output: the reply streams on stdout, tool activity is set off by markers."""

    def __init__(self, out: TextIO = sys.stdout, *, approval_hint: bool = False):
        self.out = out
        self._in_text = False
        self._in_reasoning = False
        # No one to ask at this terminal: say how another shell decides a held call.
        self.approval_hint = approval_hint

    def _line(self, text: str) -> None:
        self._in_reasoning = False
        if self._in_text:
            self.out.write("\n")
            self._in_text = False
        self.out.write(text + "\n")

    def __call__(self, event: common_pb2.Event) -> None:
        kind = event.WhichOneof("payload")
        if kind == "run_started":
            self._line(f"· run {event.run_id} on session {event.session_id}")
        elif kind == "text_delta":
            if self._in_reasoning:
                self._line("")
            self.out.write(event.text_delta.text)
            self._in_text = True
        elif kind == "reasoning_delta":
            # The model's reasoning, set apart from its answer: a block of its own, marked.
            if not self._in_reasoning:
                self._line("· thinking:")
                self._in_reasoning = True
            self.out.write(event.reasoning_delta.text)
            self._in_text = True
        elif kind == "tool_call":
            self._line(f"→ {event.tool_call.name} {shorten(event.tool_call.arguments_json)}")
        elif kind == "tool_result":
            r = event.tool_result.result
            mark = "✗" if r.is_error else "←"
            output = r.output.strip().replace("\n", "\n    ")
            if len(output) > 600:
                output = output[:600] + "…"
            self._line(f"{mark} {r.name} ({r.duration_ms:.0f} ms){': ' if output else ''}{output}")
        elif kind == "approval_request":
            a = event.approval_request
            self._line(f"? {a.name} {shorten(a.arguments_json)} waits for approval ({a.timeout_s:g} s)")
            if self.approval_hint:
                where = f"{a.call_id} --session {event.session_id}"
                self._line(f"    approve: agentmesh approvals approve {where}")
                self._line(f"    deny:    agentmesh approvals deny {where} --note 'why'")
        elif kind == "approval_resolved":
            resolved = event.approval_resolved
            how = "no decision in time" if resolved.decided_by == "timeout" else ("approved" if resolved.approved else "denied")
            self._line(f"{'✓' if resolved.approved else '✗'} {resolved.name} {how}{': ' + resolved.note if resolved.note else ''}")
        elif kind == "status":
            self._line(f"· {event.status.message}")
        elif kind == "teammate_status":
            m = event.teammate_status
            task = f" on {m.current_task}" if m.current_task else ""
            self._line(f"· teammate {m.name}: {m.state}{task} ({m.usage.total_tokens} tokens)")
        elif kind == "subagent":
            self._line(subagent_line(event.subagent))
        elif kind == "background_result":
            b = event.background_result
            output = b.result.output.strip().replace("\n", "\n    ")
            if len(output) > 600:
                output = output[:600] + "…"
            how = b.status if b.status != "finished" else f"finished, exit code {b.result.exit_code}"
            self._line(f"⇠ background {b.id} `{shorten(b.command)}` ({how}, {b.seconds:.0f} s): {output}")
        elif kind == "task_update":
            tasks = [{"id": t.id, "subject": t.subject, "status": t.status, "owner": t.owner,
                      "blocked_by": list(t.blocked_by)} for t in event.task_update.tasks]
            self._line("· tasks:\n" + "\n".join(f"    {line}" for line in render_tasks(tasks)))
        elif kind == "run_finished":
            f = event.run_finished
            reason = "" if f.stop_reason in ("", "completed") else f" ({f.stop_reason})"
            self._line(
                f"· done{reason}: {f.iterations} model call(s), {f.usage.total_tokens} tokens · trace {f.trace_id}"
            )
        elif kind == "error":
            self._line(f"✗ error {event.error.code}: {event.error.message}")
        self.out.flush()


def subagent_line(a: common_pb2.SubagentStatus) -> str:
    """`⇒ sub-agent 1 explore@0 started: find the config (session s.sub-…)`, and its end with its usage."""
    indent = "  " * max(a.depth - 1, 0)
    who = f"sub-agent {a.index}" + (f" {a.agent}@{a.agent_version}" if a.agent else "")
    if a.state == "started":
        return f"{indent}⇒ {who} started: {a.task} (session {a.session_id})"
    return (f"{indent}⇐ {who} finished ({a.stop_reason}): {a.iterations} model call(s), "
            f"{a.usage.total_tokens} tokens (in {a.usage.input_tokens}, out {a.usage.output_tokens})")


def shorten(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "…"
