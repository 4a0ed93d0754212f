"""Fixtures every suite may use."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.llm_server import ScriptedLLMServer

REPO_ROOT = Path(__file__).resolve().parent.parent


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
