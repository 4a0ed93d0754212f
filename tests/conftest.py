"""Fixtures every suite may use."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cpu_profile import ENV as CPU_PROFILE_ENV
from tests.support.cpu_profile import CpuProfile
from tests.support.llm_server import ScriptedLLMServer

REPO_ROOT = Path(__file__).resolve().parent.parent

# What `make test-fast` leaves out (marked `slow` here): directories whose tests start whole
# stacks, subprocesses, a browser, chart renders or podman, and the modules elsewhere that took
# the longest per test in a full run (2 s and more each, or 25 s and more in all, with 4 workers
# on a loaded 2-core machine): above all those that start several services as a stack (the
# agent's turns over gRPC, the CLI against a stack, retention and erasure across memory, tools
# and the gateway, an export imported into a second home). A slow test elsewhere may also say so
# itself (`pytest.mark.slow`).
SLOW_DIRS = ("e2e", "web", "helm", "images", "mcpservers", "protocols", "gateway_routing")
SLOW_MODULES = (
    "agent/test_agent_approvals.py", "agent/test_agent_background.py", "agent/test_agent_background_watch.py",
    "agent/test_agent_compact_request.py", "agent/test_agent_deep.py", "agent/test_agent_finishing.py",
    "agent/test_agent_overlap.py", "agent/test_agent_service.py", "agent/test_agent_tasks.py",
    "agent/test_agent_thinking.py", "cli/test_chat_exit_codes.py", "cli/test_cli_basics.py",
    "cli/test_export_import.py", "gateway/test_dropped_streams.py", "memory/test_edge_parts.py",
    "memory/test_erasure.py", "memory/test_kept_writes.py", "memory/test_memory_longterm.py",
    "memory/test_retention.py", "memory/test_service_imports.py", "memory/test_storage_port.py",
    "observability/test_trace_view.py", "observability/test_turn_trace_e2e.py",
    "scheduler/test_scheduler_cli.py", "scheduler/test_scheduler_firing.py", "scheduler/test_scheduler_lease.py",
    "scheduler/test_scheduler_stack.py", "security/test_internal_auth.py", "security/test_oidc.py",
    "security/test_request_bounds.py", "tools/test_search_and_web.py",
)


def pytest_configure(config):
    """`AGENTMESH_TEST_CPU_DIR=DIR`: each pytest process writes the CPU of each test and fixture
    there (tests/support/cpu_profile.py); unset, nothing is measured."""
    if out_dir := os.environ.get(CPU_PROFILE_ENV):
        config.pluginmanager.register(CpuProfile(Path(out_dir)), "agentmesh-cpu-profile")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    tests = REPO_ROOT / "tests"
    grouping = bool(config.getoption("loadgroup", default=False)) or config.getoption("dist", default=None) == "loadgroup"
    for item in items:
        where = item.path.relative_to(tests)
        if where.parts[0] in SLOW_DIRS or where.as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if grouping:
            _into_its_group(item)


def _into_its_group(item) -> None:
    """`--dist loadgroup` sends the tests of one `xdist_group` to one worker, one after the other,
    by a `@group` suffix on their ids. pytest-xdist 3.8 sets it as `item._nodeid`, which pytest 9
    no longer reads (a node's id is `item._id`), so it is set here, once, for either."""
    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                     for m in item.iter_markers("xdist_group")})
    if not groups or "@" in item.nodeid.rsplit("]", 1)[-1]:
        return
    grouped = f"{item.nodeid}@{'_'.join(groups)}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(grouped)  # noqa: SLF001 - as pytest-xdist does with _nodeid
    else:
        item._nodeid = grouped  # noqa: SLF001


@pytest.fixture
def llm():
    """The model: a real OpenAI/Anthropic-protocol HTTP server replaying what the test adds."""
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def the_suite_leaves_the_repository_root_as_it_found_it():
    """A test writes under its own temporary directories, never into the checkout: an entry
    that appears at the repository's root while the suite runs (a stray `> $name` redirect, a
    path built from a value such as an error kind, a tool run with the checkout as its working
    directory) fails the run, named, in this fixture's teardown."""
    before = set(os.listdir(REPO_ROOT))
    yield
    added = sorted(set(os.listdir(REPO_ROOT)) - before - _ignored_by_git(set(os.listdir(REPO_ROOT)) - before))
    assert not added, f"the test run left new entries at the repository's root: {added}"


def _ignored_by_git(names: set[str]) -> set[str]:
    """Those of `names` .gitignore covers: what a build the suite runs makes on purpose (`make
    images` writes build/ for its wheels), never a stray file."""
    if not names or not (REPO_ROOT / ".git").exists():
        return set()
    try:
        found = subprocess.run(["git", "check-ignore", "--stdin"], cwd=REPO_ROOT, input="\n".join(sorted(names)),
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.rstrip("/") for line in found.stdout.splitlines()}
