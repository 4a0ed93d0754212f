"""The retention sweep's clock: the leading scheduler asks the gateway to apply every
namespace's retention (Gateway.SweepRetention, docs/memory.md#retention) every
AGENTMESH_RETENTION_SWEEP_S — through `idle_reflection.run_while_leading`, the loop the idle
reflections use, so only the leader sweeps. The scheduler already holds the one lease of the
deployment; the gateway and memory do the work in bounded passes and keep the walk's place,
so a sweep cut short by a restart or a lost lease continues at the next one.
"""

from __future__ import annotations

import grpc

from agentmesh.clients.gateway import GatewayClient
from agentmesh.logs import get_logger
from agentmesh.v1 import gateway_pb2

__all__ = ["RetentionSweeps"]

log = get_logger("agentmesh.scheduler.retention")


class RetentionSweeps:
    def __init__(self, gateway: GatewayClient, max_passes: int, timeout_s: float):
        self._stub = gateway.stub
        self._max_passes = max_passes
        self._timeout_s = timeout_s

    async def sweep(self, now: float) -> int:
        """Records removed by one sweep (0 when the gateway could not be reached: next time)."""
        try:
            reply = await self._stub.SweepRetention(
                gateway_pb2.SweepRetentionRequest(now=now, max_passes=self._max_passes), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            log.warning("retention sweep failed; will try again", code=err.code().name, error=err.details())
            return 0
        removed = reply.sessions_removed + reply.workspaces_removed + reply.memories_removed + reply.usage_removed
        if removed:
            log.info("retention sweep", sessions=reply.sessions_removed, workspaces=reply.workspaces_removed,
                     memories=reply.memories_removed, usage=reply.usage_removed, done=reply.done)
        return removed
