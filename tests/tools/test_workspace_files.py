"""The workspace as people see it (ListWorkspace, ReadWorkspaceFile, WriteWorkspaceFile) over real
gRPC, called as the gateway (the only caller they admit): the file tools' path rules, no symlink
followed out, bounded sizes, clear errors."""

from __future__ import annotations

import os

import grpc
import pytest

from agentmesh.v1 import tools_pb2


async def rpc_error(awaitable) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return info.value


async def test_a_file_is_uploaded_listed_and_read(tools):
    written = await tools.as_gateway.WriteWorkspaceFile(
        tools_pb2.WriteWorkspaceFileRequest(session_id="s1", path="/workspace/in/data.bin", content=b"\x00\x01binary")
    )
    assert (written.path, written.size, written.created) == ("in/data.bin", 8, True)
    assert (tools.workspace("s1") / "in" / "data.bin").read_bytes() == b"\x00\x01binary"

    top = await tools.as_gateway.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="s1"))
    assert [(e.path, e.type) for e in top.entries] == [("in", "dir")]
    inner = await tools.as_gateway.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="s1", path="in"))
    assert [(e.path, e.name, e.type, e.size) for e in inner.entries] == [("in/data.bin", "data.bin", "file", 8)]
    assert inner.entries[0].modified_at > 0

    read = await tools.as_gateway.ReadWorkspaceFile(tools_pb2.ReadWorkspaceFileRequest(session_id="s1", path="in/data.bin", max_bytes=3))
    assert (read.content, read.size, read.truncated) == (b"\x00\x01b", 8, True)


async def test_an_existing_file_is_replaced_only_when_asked(tools):
    request = tools_pb2.WriteWorkspaceFileRequest(session_id="s1", path="a.txt", content=b"one")
    await tools.as_gateway.WriteWorkspaceFile(request)
    err = await rpc_error(tools.as_gateway.WriteWorkspaceFile(request))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "overwrite" in err.details()
    assert (tools.workspace("s1") / "a.txt").read_bytes() == b"one"
    request.overwrite, request.content = True, b"two"
    assert not (await tools.as_gateway.WriteWorkspaceFile(request)).created
    assert (tools.workspace("s1") / "a.txt").read_bytes() == b"two"


async def test_paths_out_of_the_workspace_are_refused(tools, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    await tools.as_gateway.WriteWorkspaceFile(tools_pb2.WriteWorkspaceFileRequest(session_id="s1", path="keep.txt", content=b"k"))
    workspace = tools.workspace("s1")
    os.symlink(outside, workspace / "link.txt")
    os.symlink(tmp_path, workspace / "linkdir")

    for path in ("../s2/x", "/etc/passwd", "link.txt", "linkdir/secret.txt"):
        err = await rpc_error(tools.as_gateway.ReadWorkspaceFile(tools_pb2.ReadWorkspaceFileRequest(session_id="s1", path=path)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "workspace" in err.details(), path
    err = await rpc_error(tools.as_gateway.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="s1", path="linkdir")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = await rpc_error(tools.as_gateway.WriteWorkspaceFile(
        tools_pb2.WriteWorkspaceFileRequest(session_id="s1", path="linkdir/planted.txt", content=b"x")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not (tmp_path / "planted.txt").exists() and outside.read_text() == "not yours"
    # The links themselves are listed, not followed.
    listing = await tools.as_gateway.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="s1"))
    assert {(e.name, e.type) for e in listing.entries} == {("keep.txt", "file"), ("link.txt", "symlink"), ("linkdir", "symlink")}


async def test_bad_requests_get_clear_errors(tools):
    missing = await rpc_error(tools.as_gateway.ReadWorkspaceFile(tools_pb2.ReadWorkspaceFileRequest(session_id="s1", path="nope.txt")))
    assert missing.code() == grpc.StatusCode.NOT_FOUND and missing.details() == "nope.txt does not exist in the workspace"
    bad_id = await rpc_error(tools.as_gateway.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="../x")))
    assert bad_id.code() == grpc.StatusCode.INVALID_ARGUMENT
    no_path = await rpc_error(tools.as_gateway.WriteWorkspaceFile(tools_pb2.WriteWorkspaceFileRequest(session_id="s1", content=b"x")))
    assert no_path.code() == grpc.StatusCode.INVALID_ARGUMENT and "path is required" in no_path.details()
    directory = await rpc_error(tools.as_gateway.ReadWorkspaceFile(tools_pb2.ReadWorkspaceFileRequest(session_id="s1", path=".")))
    assert directory.code() == grpc.StatusCode.INVALID_ARGUMENT and "is a directory" in directory.details()
    too_big = await rpc_error(tools.as_gateway.WriteWorkspaceFile(
        tools_pb2.WriteWorkspaceFileRequest(session_id="s1", path="big.bin", content=b"x" * (2 * 1024 * 1024 + 1))))
    assert too_big.code() == grpc.StatusCode.INVALID_ARGUMENT and "uploads are limited to 2097152 bytes" in too_big.details()
    assert not (tools.workspace("s1") / "big.bin").exists()


async def test_only_the_gateway_may_browse_or_upload(tools):
    # The agent reaches files through the tools the model calls, never through these — but for
    # the session's stored images (.attachments/), which it writes and reads back.
    err = await rpc_error(tools.stub.ListWorkspace(tools_pb2.ListWorkspaceRequest(session_id="s1")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "only the gateway service may" in err.details()
    err = await rpc_error(tools.stub.WriteWorkspaceFile(tools_pb2.WriteWorkspaceFileRequest(session_id="s1", path="x",
                                                                                            content=b"x")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "the agent service may write only the workspace's .attachments/" in err.details()
    assert not (tools.workspace("s1") / "x").exists()
    stored = tools_pb2.WriteWorkspaceFileRequest(session_id="s1", path=".attachments/a.png", content=b"\x89PNG")
    assert (await tools.stub.WriteWorkspaceFile(stored)).created


async def test_uploads_count_against_the_workspace_quota(home):
    from tests.tools.support import ToolsClient

    async with ToolsClient(home, {"AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB": "1"}) as tools:
        half = b"x" * (600 * 1024)
        await tools.as_gateway.WriteWorkspaceFile(tools_pb2.WriteWorkspaceFileRequest(session_id="q", path="a.bin", content=half))
        err = await rpc_error(tools.as_gateway.WriteWorkspaceFile(
            tools_pb2.WriteWorkspaceFileRequest(session_id="q", path="b.bin", content=half)))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "disk quota" in err.details()
        assert not (tools.workspace("q") / "b.bin").exists()
        # Replacing a file counts only what it adds.
        replaced = await tools.as_gateway.WriteWorkspaceFile(
            tools_pb2.WriteWorkspaceFileRequest(session_id="q", path="a.bin", content=half, overwrite=True))
        assert not replaced.created
