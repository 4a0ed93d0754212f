"""The task board a team shares (docs/teams.md): the lead's board, kept in memory as the team's
"board" record once the lead has a team, and changed by the lead and every teammate with a
compare-and-set (team_store.Team.change) — a change made on a board someone else changed
meanwhile is made again on theirs, so none is lost, and a claim (`task_claim`, or `task_update`
to in_progress) of a task someone else holds is refused: two teammates never get the same task,
whichever agent replicas they run on.

The lead's transcript keeps its `tasks` entries as before (task_tools.py); until the lead spawns
its first teammate the board is the transcript's alone and no record is read or written.
"""

from __future__ import annotations

from typing import Any

from agentmesh.agent.capabilities.task_tools import NAMES, SPECS, TaskBoard, latest_board
from agentmesh.agent.capabilities.tasks import IN_PROGRESS, PENDING, Board, BoardError
from agentmesh.agent.capabilities.team_store import LEAD, Team
from agentmesh.agent.loop.turn import TurnContext
from agentmesh.agent.types import ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.toolargs import ArgumentsSchema

__all__ = ["CLAIM", "SharedTaskBoard", "claimable"]

CLAIM = ToolSpec(
    name="task_claim",
    description=(
        "Take a task of the shared board for yourself: it becomes in_progress with you as its owner, and no one "
        "else can take it. Give `id`, or leave it out for the first pending task nobody owns and nothing blocks. "
        "Mark it done with task_update when finished."
    ),
    parameters={"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "description": "The task's number, as in #3."}},
        "additionalProperties": False},
)
_CLAIM_SCHEMA = ArgumentsSchema(CLAIM.name, CLAIM.parameters)
_SCHEMAS = {s.name: ArgumentsSchema(s.name, s.parameters) for s in SPECS}
BOARD_KEY = "board"


def claimable(board: Board) -> list[int]:
    """Pending tasks nobody owns and nothing blocks, by number."""
    return [t.id for t in board.tasks.values() if t.status == PENDING and not t.owner and not board.waiting_on(t)]


class SharedTaskBoard(TaskBoard):
    def __init__(self, ctx: TurnContext, team: Team, me: str):
        super().__init__(ctx)
        self.team, self.me = team, me
        # A teammate's board is the team's from the start; the lead's once it has a team.
        self.shared = me != LEAD

    async def prepare_history(self, history: list[Any]) -> list[Any]:
        self.board = latest_board(self.ctx.stored)
        if not self.shared:
            self.shared = any(m.role == "tool" and m.name == "spawn_teammate" for m in self.ctx.stored)
        if self.shared:
            await self.refresh()
        return history

    async def refresh(self) -> None:
        record = await self.team.get("board", BOARD_KEY)
        if record is not None:
            self.board = Board.from_json(record.body["board"])

    async def publish(self) -> None:
        """Make the lead's board the team's (its first spawn_teammate): from now on it is shared."""
        if self.shared:
            return
        mine = self.board.to_json()
        await self.team.change("board", BOARD_KEY, lambda body: body or {"board": mine})
        self.shared = True
        await self.refresh()

    def tools(self) -> list[ToolSpec]:
        return [*SPECS, CLAIM] if self.shared else list(SPECS)

    async def execute(self, call: ToolCall) -> ToolOutcome:
        if not self.shared:
            return await super().execute(call)
        try:
            args = (_CLAIM_SCHEMA if call.name == CLAIM.name else _SCHEMAS[call.name]).parse(call.arguments_json)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        output = ""

        def apply(body: dict[str, Any] | None) -> dict[str, Any]:
            nonlocal output
            self.board = Board.from_json(body["board"]) if body else self.board
            output = self._change(call.name, args)
            return {"board": self.board.to_json()}

        try:
            if call.name in ("task_get", "task_list"):
                await self.refresh()
                output, _ = self._apply(call.name, args)
            else:
                await self.team.change("board", BOARD_KEY, apply)
                await self.save()
        except BoardError as exc:
            await self.refresh()
            return ToolOutcome.error(call, "task_refused", f"error: {call.name}: {exc}")
        except AgentmeshError as exc:
            return ToolOutcome.error(call, "board_unavailable", f"error: {call.name}: the shared board could not be "
                                     f"reached ({exc.message}); try again")
        return ToolOutcome(call_id=call.call_id, name=call.name, output=output,
                           data={"open": len(self.board.open_tasks()), "tasks": len(self.board.tasks)})

    def _change(self, name: str, args: dict[str, Any]) -> str:
        board = self.board
        if name == CLAIM.name:
            task_id = args.get("id") or next(iter(claimable(board)), 0)
            if not task_id:
                raise BoardError("no pending task is free to take (all are owned, blocked or finished)")
            task = board.get(task_id)
            if task.status != PENDING or (task.owner and task.owner != self.me):
                holder = f" by {task.owner}" if task.owner else ""
                raise BoardError(f"task #{task_id} is {task.status}{holder}: take another")
            board.update(task_id, status=IN_PROGRESS, owner=self.me)
            return f"Claimed {board.line(board.get(task_id))}"
        if name == "task_update" and args.get("status") == IN_PROGRESS:
            task = board.get(args["id"])
            owner = args.get("owner") or self.me
            if task.owner and task.owner != owner and task.status == IN_PROGRESS:
                raise BoardError(f"task #{task.id} is already in progress by {task.owner}")
            args = {**args, "owner": owner}
        output, _ = self._apply(name, args)
        return output

    @staticmethod
    def handles(name: str) -> bool:
        return name in NAMES or name == CLAIM.name
