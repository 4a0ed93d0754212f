"""Memory's PutRunRecords, as a gateway calls it over real gRPC (services/memory/run_rpcs.py): the
records of several runs in one call, each stored and checked as PutRunRecord stores and checks
one; a record refused (an unknown state) is named in the answer with its sentence, and the
others are stored all the same."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.config import Settings
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.rpc.launch import start_service
from agentmesh.v1 import sessions_pb2
from tests.support.identities import signed_channel


async def test_runs_are_stored_together_and_a_refused_one_refuses_only_itself(tmp_path):
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path / "home")})
    host = await start_service("memory", settings, "127.0.0.1:0")
    channel = signed_channel(settings.keys_dir, "gateway", "memory", host.target)  # as the gateway calls it
    memory = memory_service_pb2_grpc.MemoryStub(channel)
    try:
        runs = [sessions_pb2.Run(run_id="run-a", session_id="s1", namespace="team-a", state="succeeded", created_at=1.0),
                sessions_pb2.Run(run_id="run-b", session_id="s2", namespace="team-a", state="asleep", created_at=2.0),
                sessions_pb2.Run(run_id="run-c", session_id="s3", state="running", created_at=3.0)]
        reply = await memory.PutRunRecords(memory_service_pb2.PutRunRecordsRequest(runs=runs), timeout=30)

        assert reply.errors[0] == "" and reply.errors[2] == ""
        assert "state 'asleep' is not one of" in reply.errors[1]
        assert (await memory.GetRunRecord(sessions_pb2.GetRunRecordRequest(run_id="run-a"), timeout=30)).state == "succeeded"
        stored = await memory.GetRunRecord(sessions_pb2.GetRunRecordRequest(run_id="run-c"), timeout=30)
        assert stored.namespace == "default" and stored.state == "running"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await memory.GetRunRecord(sessions_pb2.GetRunRecordRequest(run_id="run-b"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await channel.close()
        await host.stop(grace=1)
        host.telemetry.shutdown()
