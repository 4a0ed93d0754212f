"""The scheduler, as the agent's `schedule_wakeup` tool reaches it (capabilities/wakeups.py):
one RPC, ScheduleWakeup, signed for the user whose turn asks (the channel's identity)."""

from __future__ import annotations

from agentmesh.clients.gateway import SchedulerClient
from agentmesh.rpc.peers import peer_call
from agentmesh.v1 import scheduler_pb2

__all__ = ["GrpcWakeups"]


class GrpcWakeups:
    def __init__(self, client: SchedulerClient, timeout_s: float = 10.0):
        self._stub = client.stub
        self._target = client.target
        self._timeout_s = timeout_s

    async def schedule_wakeup(self, session_id: str, run_at: float, note: str) -> str:
        request = scheduler_pb2.ScheduleWakeupRequest(session_id=session_id, run_at=run_at, note=note)
        job = await peer_call(f"the scheduler at {self._target}",
                              self._stub.ScheduleWakeup(request, timeout=self._timeout_s))
        return str(job.job_id)
