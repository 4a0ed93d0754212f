"""How `agentmesh chat` shows the long-work events: reasoning set apart from the answer, the task
board, background results — in the human view and in `--json`."""

from __future__ import annotations

import io

from agentmesh.cli.render import HumanRenderer, event_to_json
from agentmesh.v1 import common_pb2


def event(**payload) -> common_pb2.Event:
    return common_pb2.Event(session_id="s", run_id="r", seq=1, **payload)


BOARD = common_pb2.TaskBoard(tasks=[
    common_pb2.Task(id=1, subject="fetch", status="done"),
    common_pb2.Task(id=2, subject="report", status="pending", blocked_by=[1, 3], blocked=True),
    common_pb2.Task(id=3, subject="check", status="in_progress", owner="sub-agent 1"),
])
BACKGROUND = common_pb2.BackgroundResult(id="bg-1", command="make test", status="finished", seconds=42.4,
                                         result=common_pb2.ToolResult(exit_code=0, output="ok\n3 passed"))


def test_the_human_view_keeps_reasoning_apart_and_shows_board_and_background():
    out = io.StringIO()
    render = HumanRenderer(out)
    for e in (event(reasoning_delta=common_pb2.ReasoningDelta(text="Let me ")),
              event(reasoning_delta=common_pb2.ReasoningDelta(text="think.")),
              event(text_delta=common_pb2.TextDelta(text="The answer.")),
              event(task_update=BOARD), event(background_result=BACKGROUND)):
        render(e)
    assert out.getvalue().splitlines() == [
        "· thinking:", "Let me think.", "", "The answer.",
        "· tasks:",
        "    [x] #1 fetch — done",
        "    [ ] #2 report — pending (blocked by #3)",
        "    [~] #3 check @sub-agent 1 — in_progress",
        "    3 tasks: 1 done, 1 in progress, 1 pending",
        "⇠ background bg-1 `make test` (finished, exit code 0, 42 s): ok",
        "    3 passed",
    ]


def test_json_events_carry_the_new_payloads():
    assert event_to_json(event(reasoning_delta=common_pb2.ReasoningDelta(text="hm")))["text"] == "hm"
    board = event_to_json(event(task_update=BOARD))
    assert board["type"] == "task_update" and board["tasks"][1] == {
        "id": 2, "subject": "report", "description": "", "status": "pending", "owner": "", "blocked_by": [1, 3],
        "blocked": True}
    background = event_to_json(event(background_result=BACKGROUND))
    assert {k: background[k] for k in ("type", "id", "status", "exit_code", "output")} == {
        "type": "background_result", "id": "bg-1", "status": "finished", "exit_code": 0, "output": "ok\n3 passed"}


def test_a_sub_agent_shows_its_start_and_its_end_with_its_usage():
    started = common_pb2.SubagentStatus(state="started", call_id="c1", index=1, depth=1, task="find the config",
                                        agent="explore", agent_version=0, session_id="s.sub-1", run_id="r1")
    finished = common_pb2.SubagentStatus()
    finished.CopyFrom(started)
    finished.state, finished.stop_reason, finished.iterations = "finished", "completed", 2
    finished.usage.CopyFrom(common_pb2.Usage(input_tokens=120, output_tokens=30, total_tokens=150))
    nested = common_pb2.SubagentStatus(state="started", index=1, depth=2, task="grep it", session_id="s.sub-1.sub-2")
    out = io.StringIO()
    render = HumanRenderer(out)
    for status in (started, nested, finished):
        render(event(subagent=status))
    assert out.getvalue().splitlines() == [
        "⇒ sub-agent 1 explore@0 started: find the config (session s.sub-1)",
        "  ⇒ sub-agent 1 started: grep it (session s.sub-1.sub-2)",
        "⇐ sub-agent 1 explore@0 finished (completed): 2 model call(s), 150 tokens (in 120, out 30)",
    ]
    shown = event_to_json(event(subagent=finished))
    assert {k: shown[k] for k in ("type", "state", "agent", "agent_version", "child_session_id", "stop_reason",
                                  "iterations", "usage")} == {
        "type": "subagent", "state": "finished", "agent": "explore", "agent_version": 0,
        "child_session_id": "s.sub-1", "stop_reason": "completed", "iterations": 2,
        "usage": {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150}}
    assert "usage" not in event_to_json(event(subagent=started))
