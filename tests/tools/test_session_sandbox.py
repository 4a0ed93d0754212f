"""Session sandboxes (AGENTMESH_SANDBOX_ISOLATION=session) through the real tools service over
gRPC with real bubblewrap jails: the persistent Python interpreter, the jail's life (idle reaping,
deletion, a jail killed mid-call) and what one session can see of another."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from agentmesh.internal.v1 import tools_service_pb2
from tests.tools.support import ToolsClient, processes_with, wait_until
from tests.tools.test_cell_results import jail_has

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")

SESSION = {"AGENTMESH_SANDBOX_ISOLATION": "session"}


def descendants() -> set[int]:
    """Pids below this test process (the tools service runs in it): its jails and their programs."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, pending = set(), [os.getpid()]
    while pending:
        for child in children.get(pending.pop(), []):
            found.add(child)
            pending.append(child)
    return found


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _program(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""  # it ended meanwhile


def session_jails() -> list[int]:
    """The outer bwrap process of each of this test's session sandboxes (bwrap's own init in the
    jail carries the same command line, one level down)."""
    ours = descendants()
    jails = {pid for pid in processes_with("session_supervisor") if pid in ours and _program(pid).endswith(b"bwrap")}
    return sorted(pid for pid in jails if _parent(pid) not in jails)


@pytest.fixture
async def session(home):
    async with ToolsClient(home, SESSION) as client:
        yield client


async def test_the_interpreter_remembers_until_restarted(session):
    first = await session.call("python", {"code": "x = 41"})
    assert not first.is_error, first.output
    later = await session.call("shell", {"command": "echo in between"})  # a shell call leaves it alone
    assert later.output == "in between"
    result = await session.call("python", {"code": "print(x + 1)"})
    assert result.stdout == "42\n", result.output
    value = await session.call("python", {"code": "x * 2"})  # a last bare expression is shown
    assert value.output == "82"

    restarted = await session.call("python", {"restart": True})
    assert not restarted.is_error
    gone = await session.call("python", {"code": "print(x)"})
    assert gone.is_error and "NameError" in gone.stderr


async def test_a_timeout_interrupts_the_cell_and_keeps_the_variables(session):
    await session.call("python", {"code": "import math\nkept = math.pi"})
    stuck = await session.call("python", {"code": "while True: pass", "timeout_s": 1})
    assert stuck.error_kind == "timeout" and "KeyboardInterrupt" in stuck.stderr, stuck.output
    after = await session.call("python", {"code": "print(round(kept, 2))"})
    assert after.stdout == "3.14\n", after.output


async def test_a_shell_timeout_kills_that_call_only(session):
    await session.call("python", {"code": "y = 'still here'"})
    stuck = await session.call("shell", {"command": "sleep 60", "timeout_s": 0.5})
    assert stuck.error_kind == "timeout"
    after = await session.call("python", {"code": "y"})
    assert after.output == "'still here'"


async def test_an_idle_sandbox_is_reaped_and_recreated_with_its_workspace(home):
    async with ToolsClient(home, {**SESSION, "AGENTMESH_SANDBOX_SESSION_IDLE_S": "0.3"}) as client:
        await client.call("shell", {"command": "echo kept > notes.txt"})
        await client.call("python", {"code": "z = 1"})
        assert session_jails()
        assert await wait_until(lambda: not session_jails(), timeout_s=30)
        again = await client.call("shell", {"command": "cat notes.txt"})
        assert again.output == "kept"
        fresh = await client.call("python", {"code": "z"})
        assert "NameError" in fresh.stderr  # a new interpreter: the old one went with its jail


async def test_killing_the_jail_mid_call_gives_an_error_result(session):
    marker = f"m{uuid.uuid4().hex[:10]}"
    call = asyncio.create_task(session.call("shell", {"command": f": {marker}; sleep 60"}))
    assert await wait_until(lambda: bool(processes_with(marker)))
    for pid in session_jails():
        os.kill(pid, signal.SIGKILL)
    result = await call
    assert result.is_error and result.error_kind == "sandbox_error", result.output
    assert await wait_until(lambda: not processes_with(marker))
    after = await session.call("shell", {"command": "echo a new jail"})  # the next call starts one
    assert after.output == "a new jail"


async def test_deleting_the_workspace_ends_the_sandbox(session):
    await session.call("shell", {"command": "echo x > f"})
    assert session_jails()
    deleted = await session.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="s1"), timeout=30)
    assert deleted.deleted
    assert await wait_until(lambda: not session_jails())


async def test_one_session_sees_nothing_of_another(session):
    marker = f"m{uuid.uuid4().hex[:10]}"
    await session.call("shell", {"command": f"echo secret > /tmp/{marker}; echo diary > diary-{marker}"},
                       session_id="alice")
    await session.call("python", {"code": f"alice_value = '{marker}'"}, session_id="alice")
    started = await session.call("background_run", {"command": f": {marker}; sleep 30"}, session_id="alice")
    assert not started.is_error, started.output
    # The marker is split in the command so the command's own text does not hold it.
    looks = await session.call("shell", {"command": "ls -a /tmp /workspace /workspace/..; ps ax; "
                                                    f"m={marker[:4]}; grep -rs \"$m{marker[4:]}\" /tmp /proc/*/cmdline"},
                               session_id="bob")
    assert marker not in looks.output
    cell = await session.call("python", {"code": "print('alice_value' in globals())"}, session_id="bob")
    assert cell.stdout == "False\n"
    assert len(session_jails()) == 2  # a jail each
    await session.as_gateway.DeleteWorkspace(tools_service_pb2.DeleteWorkspaceRequest(session_id="alice"), timeout=30)
    assert await wait_until(lambda: not processes_with(marker))


async def test_a_background_server_is_reachable_from_later_calls(session):
    port = 8000 + uuid.uuid4().int % 1000
    started = await session.call("background_run", {"command": f"python3 -m http.server {port} --bind 127.0.0.1"})
    assert not started.is_error, started.output
    fetch = (f"import time, urllib.request\nfor _ in range(200):\n    try:\n"
             f"        print(urllib.request.urlopen('http://127.0.0.1:{port}/').status); break\n"
             "    except OSError:\n        time.sleep(0.05)\n")
    reached = await session.call("python", {"code": fetch})
    assert reached.stdout == "200\n", reached.output
    stopped = await session.stub.StopBackground(tools_service_pb2.StopBackgroundRequest(session_id="s1"), timeout=30)
    assert stopped.stopped == 1


@pytest.mark.skipif(not jail_has("matplotlib"), reason="the system Python has no matplotlib")
async def test_a_figure_lands_in_the_workspace_as_png(session):
    result = await session.call("python", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])"})
    assert not result.is_error, result.output
    assert ".outputs/figure-1.png" in result.output
    assert session.workspace("s1").joinpath(".outputs/figure-1.png").read_bytes().startswith(b"\x89PNG")


async def test_a_running_background_command_can_be_read_and_stopped(session):
    marker = f"m{uuid.uuid4().hex[:10]}"
    # It writes `<marker>-2`: text its command line (which the listing shows) does not hold.
    started = await session.call("background_run", {"command": f"echo {marker}-$((1 + 1)); sleep 60"})
    command_id = started.output.split()[1]
    seen = {}

    async def read() -> bool:
        seen["check"] = await session.call("background_check", {"id": command_id})
        return f"{marker}-2" in seen["check"].output

    for _ in range(200):  # until the command has written its line (a liveness bound)
        if await read():
            break
        await asyncio.sleep(0.05)
    assert "running" in seen["check"].output and "[output so far]" in seen["check"].output, seen["check"].output
    stopped = await session.call("background_stop", {"id": command_id})
    assert stopped.output == f"Stopped {command_id}."
    assert await wait_until(lambda: not processes_with(marker))
    listed = await session.call("background_check", {})
    assert f"{command_id} " in listed.output and "stopped" in listed.output


async def test_a_cell_that_times_out_waiting_for_another_never_runs_and_spares_it(session):
    code = "import pathlib, time\npathlib.Path('first-started').touch()\ntime.sleep(3)\nfirst_done = True"
    first = asyncio.create_task(session.call("python", {"code": code}, call_id="first"))
    # Once the first runs, the second waits for the interpreter.
    assert await wait_until(lambda: session.workspace("s1").joinpath("first-started").exists())
    second = await session.call("python", {"code": "second_ran = True", "timeout_s": 0.5}, call_id="second")
    assert second.error_kind == "timeout" and "did not start" in second.stderr, second.output
    assert not (await first).is_error
    seen = await session.call("python", {"code": "print(first_done, 'second_ran' in globals())"})
    assert seen.stdout == "True False\n", seen.output


async def test_a_stopped_supervisor_still_gives_a_timeout_result(session):
    # The supervisor runs as the programs' own user, so a program can stop it; the call's
    # timeout then ends the whole jail rather than hang. (The shell's parent is the spawner, whose
    # parent is the supervisor.)
    stop = "kill -STOP $(cut -d' ' -f4 /proc/$PPID/stat); sleep 60"
    stuck = await session.call("shell", {"command": stop, "timeout_s": 1})
    assert stuck.error_kind == "timeout", stuck.output
    assert await wait_until(lambda: not session_jails())
    after = await session.call("shell", {"command": "echo a new jail"})
    assert after.output == "a new jail"


async def test_a_call_the_supervisor_cannot_start_is_answered_with_why_at_once_and_the_jail_stays(session):
    # A program can lower the supervisor's limits too (same user): with no file descriptor left
    # for a call's pipes, the call is answered with the reason instead of waiting out its time
    # limit, and the interpreter's state (on pipes it already holds) stays.
    assert not (await session.call("python", {"code": "kept = 42"})).is_error
    await session.call("shell", {"command": "prlimit --pid $(cut -d' ' -f4 /proc/$PPID/stat) --nofile=1"})
    refused = await session.call("shell", {"command": "echo never", "timeout_s": 30}, call_id="c2")
    assert refused.error_kind == "sandbox_error", refused.output
    assert "could not run this call" in refused.output and "Too many open files" in refused.output
    assert "never" not in refused.output
    kept = await session.call("python", {"code": "print(kept)"}, call_id="c3")
    assert kept.output == "42", kept.output


async def test_a_png_the_cell_writes_is_named_in_the_result(session):
    """Without matplotlib (a system Python may have none): a PNG written by the cell's own code
    (the standard library's zlib) is named as a figure, as one saved by savefig would be."""
    code = (
        "import struct, zlib, os\n"
        "def chunk(kind, data):\n"
        "    body = kind + data\n"
        "    return struct.pack('>I', len(data)) + body + struct.pack('>I', zlib.crc32(body))\n"
        "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 0, 0, 0, 0))\n"
        "png += chunk(b'IDAT', zlib.compress(b'\\x00\\x80')) + chunk(b'IEND', b'')\n"
        "os.makedirs('.outputs', exist_ok=True)\n"
        "open('.outputs/plot.png', 'wb').write(png)\n"
    )
    result = await session.call("python", {"code": code})
    assert not result.is_error, result.output
    assert "[figures saved: .outputs/plot.png]" in result.output
    assert session.workspace("s1").joinpath(".outputs/plot.png").read_bytes().startswith(b"\x89PNG")
    again = await session.call("python", {"code": "print('no new figure')"})
    assert "figures saved" not in again.output


def spawners() -> list[int]:
    return [pid for pid in processes_with("spawner") if pid in descendants() and _program(pid).endswith(b"python3")]


async def test_a_killed_spawner_fails_its_call_and_the_next_call_gets_a_new_one(session):
    """A call's process starts from the session's spawner, which runs as the programs' own user:
    a program that kills it gets an answer, and the session (its interpreter too) goes on."""
    await session.call("python", {"code": "kept = 'yes'"})
    marker = f"m{uuid.uuid4().hex[:10]}"
    killed = await session.call("shell", {"command": f": {marker}; kill -KILL $PPID; sleep 60", "timeout_s": 30})
    assert killed.is_error and killed.exit_code == 137, killed.output
    assert "process starter ended" in killed.stderr
    assert await wait_until(lambda: not processes_with(marker))  # the call's process went with it
    after = await session.call("shell", {"command": "echo started again"})
    assert after.output == "started again"
    assert (await session.call("python", {"code": "kept"})).output == "'yes'"  # the same jail
    assert await wait_until(lambda: len(spawners()) == 1)


async def test_a_spawner_at_its_cpu_limit_finishes_its_calls_and_hands_over(session):
    """The spawner's own CPU time counts against the limit it holds for the calls; at the soft
    limit (SIGXCPU) it starts no more and a new one takes over, the calls it started unharmed."""
    first = await session.call("shell", {"command": "kill -XCPU $PPID; sleep 0.2; echo $PPID"})
    assert not first.is_error, first.output
    second = await session.call("shell", {"command": "echo $PPID"})
    assert not second.is_error and second.output != first.output, (first.output, second.output)
    assert await wait_until(lambda: len(spawners()) == 1)  # the old one ended when its last call did


async def test_a_command_too_large_for_one_message_to_the_spawner_runs_and_keeps_it(session):
    """A command of 60,000 non-ASCII characters (120 KB, within what the kernel takes as one
    argument; 360 KB as the JSON sent to the spawner, more than one socket message may hold)
    still runs, and the spawner serves the next call."""
    before = await session.call("shell", {"command": "echo $PPID"})
    text = "é" * 60_000
    big = await session.call("shell", {"command": f"printf %s '{text}' | wc -c"})
    assert not big.is_error and big.output == str(2 * len(text)), big.output[:300]
    after = await session.call("shell", {"command": "echo $PPID"})
    assert after.output == before.output  # the same spawner
