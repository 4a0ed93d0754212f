"""The workspace quota counts files (inodes) as well as bytes: 200,000 empty files took 4.3 MiB of
a 1 GiB quota and 200k of the host's inodes, and made every later call walk them."""

from __future__ import annotations

import pytest

from tests.tools.support import ToolsClient

LIMIT = 500


@pytest.fixture
async def limited(home):
    async with ToolsClient(home, {"AGENTMESH_TOOLS_WORKSPACE_QUOTA_FILES": str(LIMIT)}) as client:
        yield client


async def test_a_command_making_more_files_than_the_limit_is_stopped_and_told(limited):
    result = await limited.call("shell", {"command": "i=0; while [ $i -lt 3000 ]; do : > f$i; i=$((i+1)); done; echo done"})
    assert result.is_error and result.error_kind == "disk_quota", result.output
    assert f"over its limit of {LIMIT} files" in result.output
    assert "delete files you no longer need" in result.output


async def test_past_the_limit_new_files_are_refused_until_some_are_deleted(limited):
    made = await limited.call("shell", {"command": f"mkdir d && cd d && i=0; while [ $i -lt {LIMIT} ]; do : > f$i; i=$((i+1)); done"})
    assert made.error_kind == "disk_quota", made.output
    refused = await limited.call("write_file", {"path": "one-more.txt", "content": "x"})
    assert refused.is_error and refused.error_kind == "disk_quota" and f"limit of {LIMIT} files" in refused.output
    # Rewriting a file that exists adds none, and a call that deletes is not stopped.
    assert not (await limited.call("write_file", {"path": "d/f1", "content": "y"})).is_error
    freed = await limited.call("shell", {"command": "rm -r d && echo freed"})
    assert not freed.is_error and "freed" in freed.output
    assert not (await limited.call("write_file", {"path": "one-more.txt", "content": "x"})).is_error


async def test_a_session_under_the_limit_works(limited):
    result = await limited.call("shell", {"command": "mkdir -p a/b && touch a/b/c a/d && ls -R | wc -l"})
    assert not result.is_error, result.output
