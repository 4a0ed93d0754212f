"""Tool policies as the gateway, the agent and the CLI read them (agentmesh.toolpolicy): layers
that only narrow, patterns, and the checks that refuse a policy before it changes anything."""

from __future__ import annotations

import pytest

from agentmesh.errors import InvalidArgument
from agentmesh.toolpolicy import ToolPolicy, allowed_by_all, validate_permission_mode, validate_policy


def test_an_empty_allow_list_allows_everything_and_deny_wins():
    assert ToolPolicy().allows("shell")
    policy = ToolPolicy(allow=("read_*", "shell"), deny=("shell",))
    assert policy.allows("read_file") and not policy.allows("shell") and not policy.allows("write_file")


def test_layers_only_narrow():
    namespace = ToolPolicy(deny=("shell",))
    session = ToolPolicy(allow=("read_file", "write_file"))
    turn = ToolPolicy(allow=("write_file", "shell"))  # asks for shell: no layer can add it back
    layers = [namespace, session, turn]
    assert [name for name in ("read_file", "write_file", "shell", "grep") if allowed_by_all(layers, name)] == ["write_file"]


def test_mcp_patterns_match_a_whole_server():
    policy = ToolPolicy(deny=("github__*",))
    assert not policy.allows("github__create_issue") and policy.allows("docs__search")


def test_bad_entries_and_unknown_names_are_refused_with_the_name():
    known = frozenset({"shell", "read_file"})
    with pytest.raises(InvalidArgument, match="no tool named 'shel'"):
        validate_policy([], ["shel"], "tools", known)
    with pytest.raises(InvalidArgument, match="not a tool name or pattern"):
        validate_policy(["rm -rf"], [], "tools")
    with pytest.raises(InvalidArgument, match="at most 64"):
        validate_policy([f"t{i}" for i in range(65)], [], "tools")
    # Patterns and MCP tools (whose server may be away) are checked for their form only.
    assert validate_policy(["read_*", "github__create_issue"], [], "tools", known).allow == ("read_*", "github__create_issue")


def test_permission_modes():
    assert [validate_permission_mode(m) for m in ("", "auto", "normal", "manual")] == ["", "auto", "normal", "manual"]
    with pytest.raises(InvalidArgument, match="auto, normal or manual"):
        validate_permission_mode("yolo")
