"""The run RPCs' logic (docs/api.md, "Runs"): CreateRun starts a turn that runs on inside the
gateway with no client attached; GetRun, ListRuns, JoinRun and CancelRun read, follow and stop
it. Plain async Python over the core and its run ledger (runs.py); the servicer routes each call
to the replica that runs the run's session, as it does for Chat and AttachTurn.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

from agentmesh.errors import FailedPrecondition, InvalidArgument
from agentmesh.gateway.authz import ANYONE, Authorizer, Caller
from agentmesh.gateway.core import Gateway
from agentmesh.gateway.runs import TERMINAL_STATES, LocalRun, closing_event, require_run
from agentmesh.ids import new_id, validate_id
from agentmesh.logs import get_logger
from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2

__all__ = ["RunRpcs", "validate_join", "validate_run_id"]

log = get_logger("agentmesh.gateway")

MAX_RUN_ID_CHARS = 128


def validate_run_id(run_id: str) -> str:
    if not run_id:
        raise InvalidArgument("run_id is required: the id CreateRun (or a turn's run_started) gave", field="run_id")
    if len(run_id) > MAX_RUN_ID_CHARS or not all(c.isalnum() or c in "._:-" for c in run_id):
        raise InvalidArgument(f"run_id {run_id[:64]!r} must be 1-{MAX_RUN_ID_CHARS} letters, digits, '.', '_', ':' or '-'",
                              field="run_id")
    return run_id


def validate_join(run_id: str, after_seq: int) -> None:
    validate_run_id(run_id)
    if after_seq < 0:
        raise InvalidArgument("after_seq must not be negative: the seq of the last event seen, or 0", field="after_seq")


class RunRpcs:
    def __init__(self, core: Gateway, authz: Authorizer, check_webhook: Callable[[str], Awaitable[None]] | None = None):
        self._core = core
        self._authz = authz
        # The egress check of a webhook URL (webhooks.py); None: webhooks are not served here.
        self._check_webhook = check_webhook
        self._ledger = core.runs
        # The turns CreateRun started: held here so they are not collected while they run.
        self._tasks: set[asyncio.Task[None]] = set()

    async def create(self, request: gateway_pb2.CreateRunRequest, caller: Caller = ANYONE) -> sessions_pb2.Run:
        """Start the turn and answer once it holds its session or waits in line for it; the
        turn's own refusals (busy, limits, another tenant's session) are this call's."""
        chat = gateway_pb2.ChatRequest(session_id=request.session_id, message=request.message, options=request.options)
        self._core.validate_chat(chat)
        if request.webhook_url:
            if self._check_webhook is None:
                raise FailedPrecondition("this gateway delivers no webhooks", field="webhook_url")
            await self._check_webhook(request.webhook_url)
        run_id = new_id("run")
        begun = self._ledger.expect(run_id, request.webhook_url)

        async def run_on() -> None:
            # Nobody reads these events here: the run's feed keeps them for JoinRun.
            async for _ in self._core.chat(chat, caller, run_id=run_id):
                pass

        task = asyncio.create_task(run_on())
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        try:
            pending: list[asyncio.Future[Any]] = [begun, task]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not begun.done():
                task.result()  # refused before the run began: its error is the answer
                raise FailedPrecondition("the run ended before it began")  # not reached: chat begins or raises
            local = begun.result()
            accepted = asyncio.ensure_future(local.accepted.wait())
            await asyncio.wait({accepted, task}, return_when=asyncio.FIRST_COMPLETED)
            accepted.cancel()
            if task.done() and task.exception() is not None and not local.record.started_at and not local.queued:
                task.result()
            # Recorded before the answer, so any replica finds the run its id names.
            written = asyncio.ensure_future(local.written.wait())
            await asyncio.wait({written, task}, return_when=asyncio.FIRST_COMPLETED)
            written.cancel()
            return _copy(local.record)
        finally:
            self._ledger.forget_expected(run_id)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("run ended with an error", error=str(task.exception()))

    async def get(self, run_id: str, caller: Caller = ANYONE) -> sessions_pb2.Run:
        run = await self._ledger.get(validate_run_id(run_id))
        return _copy(require_run(caller, run, "GetRun"))

    async def list(self, request: gateway_pb2.ListTurnRunsRequest, caller: Caller = ANYONE) -> gateway_pb2.ListTurnRunsResponse:
        if request.session_id:
            validate_id(request.session_id)
            session = await self._authz.session(caller, request.session_id, "ListRuns")
            namespace = session.namespace or "default"
        else:
            namespace = self._authz.namespace(caller, request.namespace, "ListRuns")
        reply = await self._ledger.list(sessions_pb2.ListRunRecordsRequest(
            namespace=namespace, session_id=request.session_id, states=list(request.states),
            created_after=request.created_after, created_before=request.created_before,
            page_size=request.page_size, page_token=request.page_token))
        return gateway_pb2.ListTurnRunsResponse(runs=reply.runs, next_page_token=reply.next_page_token)

    async def join(self, run_id: str, after_seq: int, caller: Caller = ANYONE) -> AsyncIterator[common_pb2.Event]:
        validate_join(run_id, after_seq)
        local = self._ledger.local(run_id)
        if local is not None:
            require_run(caller, local.record, "JoinRun")
            async for event in self._ledger.events(local, after_seq):
                yield event
            return
        run = require_run(caller, await self._ledger.get(run_id), "JoinRun")
        if run.state not in TERMINAL_STATES:
            # Its record says it runs, but not here, and routing sent the call here: the replica
            # that ran it went away without ending it.
            raise FailedPrecondition(
                f"run {run_id!r} is recorded as {run.state} but no gateway runs it now; its gateway stopped "
                "before it ended — its transcript has what it did", metadata={"run_id": run_id})
        if after_seq < max(run.last_event_seq, 1):
            yield closing_event(run)

    async def cancel(self, run_id: str, caller: Caller = ANYONE) -> sessions_pb2.Run:
        """Stop the run if it runs here; a run that already ended is answered as it is."""
        run = require_run(caller, await self._ledger.get(validate_run_id(run_id)), "CancelRun")
        local = self._ledger.local(run_id)
        if (local is not None and local.record.state not in TERMINAL_STATES
                and self._core.cancel_run(run.session_id, run_id)):
            # Answer with the run as it ended, not as it was when asked to stop.
            await local.began.wait()
            await _ended(local)
        return _copy(local.record if local is not None else run)


async def _ended(local: LocalRun) -> None:
    """Wait until the cancelled run's last event is relayed (its record then says cancelled)."""
    if local.feed is not None:
        async for event in local.feed.follow():
            if event.run_id == local.record.run_id and event.WhichOneof("payload") in ("run_finished", "error"):
                return


def _copy(run: sessions_pb2.Run) -> sessions_pb2.Run:
    copy = sessions_pb2.Run()
    copy.CopyFrom(run)
    return copy
