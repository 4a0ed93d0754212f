"""One suite of behaviours every executor must show, run against each (docs/architecture.md: both
executors share one interface and one test suite). The `kubernetes` variant needs KUBECONFIG."""

from __future__ import annotations

import asyncio
import json
import os
import uuid

import pytest

from agentmesh.internal.v1 import tools_service_pb2
from tests.tools.backends import BACKENDS
from tests.tools.support import ToolsClient, wait_until

PARAMS = [
    pytest.param("local", id="local"),
    pytest.param("local-session", id="local-session"),
    pytest.param("fake-kubernetes", id="fake-kubernetes"),
    pytest.param("fake-kubernetes-session", id="fake-kubernetes-session"),
    pytest.param(
        "kubernetes",
        id="kubernetes",
        marks=[pytest.mark.kubernetes, pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set")],
    ),
]


@pytest.fixture(params=PARAMS)
async def backend(request, home):
    backend = BACKENDS[request.param](home)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
async def tools(backend, home):
    async with ToolsClient(home, backend.env()) as client:
        yield client


def marker() -> str:
    return f"{uuid.uuid4().int % 10**6 + 1000}.5"


async def assert_clean(backend, mark: str) -> None:
    assert await wait_until(lambda: not backend.leftovers(mark)), backend.leftovers(mark)


async def test_runs_a_command_and_returns_its_output(tools, backend):
    # A unique word, so that no unrelated process on the machine is taken for a leftover.
    word = f"hello{uuid.uuid4().hex[:8]}"
    result = await tools.call("shell", {"command": f"echo {word}; echo done"})
    assert not result.is_error, result.output
    assert result.exit_code == 0
    assert f"{word}\ndone" in result.stdout
    await assert_clean(backend, word)


async def test_reports_a_nonzero_exit(tools, backend):
    word = f"failing{uuid.uuid4().hex[:8]}"
    result = await tools.call("shell", {"command": f"echo {word}; exit 7"})
    assert result.is_error and result.error_kind == "nonzero_exit"
    assert result.exit_code == 7
    assert word in result.output and "[exit code 7]" in result.output
    await assert_clean(backend, word)


async def test_runs_python(tools, backend):
    result = await tools.call("python", {"code": "import sys; print(sum(range(10)), sys.version_info[0])"})
    assert not result.is_error, result.output
    assert result.stdout.strip() == "45 3"


async def test_files_persist_between_calls_of_a_session(tools, backend):
    if backend.name == "kubernetes" and not os.environ.get("AGENTMESH_SANDBOX_WORKSPACE_PVC"):
        pytest.skip("files persist on a cluster only with AGENTMESH_SANDBOX_WORKSPACE_PVC")
    first = await tools.call("shell", {"command": "mkdir -p data && echo kept > data/note.txt"})
    assert not first.is_error, first.output
    second = await tools.call("shell", {"command": "cat data/note.txt"})
    assert second.stdout.strip() == "kept"
    if backend.shares_files_with_service:
        read = await tools.call("read_file", {"path": "data/note.txt"})
        assert read.output == "kept\n"
        await tools.call("write_file", {"path": "from-tool.txt", "content": "written by write_file"})
        seen = await tools.call("shell", {"command": "cat from-tool.txt"})
        assert seen.stdout == "written by write_file"


async def test_the_environment_is_clean_and_carries_the_trace(tools, backend):
    result = await tools.call("shell", {"command": "env"})
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert not [n for n in names if n.startswith(("AGENTMESH", "KUBERNETES_SERVICE", "KUBECONFIG"))]
    assert "sk-test-secret-key" not in result.stdout
    assert "HOME=/workspace" in result.stdout


async def test_timeout_stops_the_program(tools, backend):
    mark = marker()
    result = await tools.call("shell", {"command": f"echo started; sleep {mark}", "timeout_s": 1})
    assert result.is_error and result.error_kind == "timeout"
    assert "time limit" in result.output
    await assert_clean(backend, mark)


async def test_cancel_stops_the_program_and_cleans_up(tools, backend):
    mark = marker()
    call = tools.stub.Execute(
        tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name="shell", arguments_json=json.dumps({"command": f"echo started > started.txt; sleep {mark}"}))
    )
    started = tools.workspace("s1") / "started.txt"
    assert await wait_until(started.exists, timeout_s=30) or not backend.shares_files_with_service
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await assert_clean(backend, mark)


async def test_large_output_is_capped_with_a_marker(tools, backend):
    result = await tools.call("python", {"code": "print('head'); print('y' * 300000); print('tail')"})
    assert result.truncated
    assert result.stdout.startswith("head\n")
    assert "truncated" in result.stdout
    assert len(result.stdout) < 80_000


async def test_a_memory_hog_is_stopped_and_reported(tools, backend):
    result = await tools.call("python", {"code": "x = b'x' * (400 * 1024 * 1024)\nimport time; time.sleep(5)\nprint('survived')"})
    assert result.is_error
    assert "survived" not in result.output
    if backend.name.startswith("local"):
        assert "MemoryError" in result.stderr  # the jail's address-space limit
    else:
        assert result.error_kind == "oom" and "out of memory" in result.output  # the pod's memory limit


async def test_the_local_jail_follows_its_process_without_a_thread_of_its_own(home):
    """Each jailed process is followed on the event loop (a pidfd), not by a thread started per
    call: while one runs, the service has no thread waiting for it, and its end is seen at once."""
    import threading

    async with ToolsClient(home, BACKENDS["local"](home).env()) as client:
        await client.call("shell", {"command": "true"})  # the service's own threads are up
        before = {t.name for t in threading.enumerate()}
        call = asyncio.ensure_future(client.call("shell", {"command": "echo started > started.txt; sleep 1.5"}))
        assert await wait_until((client.workspace("s1") / "started.txt").exists)
        during = {t.name for t in threading.enumerate()} - before
        result = await call
    assert not result.is_error, result.output
    assert not [name for name in during if "waitpid" in name], during
    # How soon its end is seen is measured by benches/sandbox.py, not asserted here.
