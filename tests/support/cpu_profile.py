"""CPU per test, for finding what makes the suite slow on a machine of few cores.

Wall time (`--durations`) says which tests wait; on a loaded machine it says little about which
cost. This plugin records, for each test's setup, call and teardown, the CPU the pytest process
used (user + sys, all its threads: the in-process servers of a stack count) and the CPU of the
child processes it reaped meanwhile (services started with `agentmesh serve`, jails, a browser's
driver when it is closed), and for each fixture the CPU of its own setup (what the fixtures it
asked for cost is theirs, not its). A child still running when a phase ends is counted in the
phase that reaps it: a module's browser in the teardown of the module's last test.

Enabled only when `AGENTMESH_TEST_CPU_DIR` names a directory (tests/conftest.py loads it then, and
otherwise costs nothing): each pytest process (each xdist worker) writes `cpu-<worker>.json` there
at its end. Rank a run's files with `python -m tests.support.cpu_profile DIR`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest

__all__ = ["ENV", "CpuProfile", "main"]

ENV = "AGENTMESH_TEST_CPU_DIR"


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class CpuProfile:
    """The pytest plugin: per-phase CPU of each test and exclusive setup CPU of each fixture."""

    def __init__(self, out_dir: Path) -> None:
        self._out_dir = out_dir
        self._tests: dict[str, dict[str, list[float]]] = defaultdict(dict)
        self._fixtures: list[dict[str, Any]] = []
        self._fixture_stack: list[float] = []
        self._current = ""
        self._started = _cpu()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        self._current = item.nodeid
        return (yield from self._phase(item.nodeid, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        return (yield from self._phase(item.nodeid, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        return (yield from self._phase(item.nodeid, "teardown"))

    def _phase(self, nodeid: str, phase: str) -> Iterator[None]:
        own0, children0 = _cpu()
        try:
            return (yield)
        finally:
            own1, children1 = _cpu()
            self._tests[nodeid][phase] = [round(own1 - own0, 4), round(children1 - children0, 4)]

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
        own0, children0 = _cpu()
        self._fixture_stack.append(0.0)
        try:
            return (yield)
        finally:
            own1, children1 = _cpu()
            nested = self._fixture_stack.pop()
            total = (own1 - own0) + (children1 - children0)
            if self._fixture_stack:
                self._fixture_stack[-1] += total
            self._fixtures.append({"fixture": fixturedef.argname, "scope": fixturedef.scope,
                                   "test": self._current, "cpu": round(total - nested, 4)})

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        own0, children0 = self._started
        own1, children1 = _cpu()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self._out_dir.mkdir(parents=True, exist_ok=True)
        (self._out_dir / f"cpu-{worker}.json").write_text(json.dumps({
            "worker": worker, "own": round(own1 - own0, 2), "children": round(children1 - children0, 2),
            "tests": self._tests, "fixtures": self._fixtures}))


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def main(argv: list[str]) -> None:
    """Prints the ranking of a run's files: by test, by module, by fixture, setup against call."""
    top = int(argv[1]) if len(argv) > 1 else 25
    runs = [json.loads(p.read_text()) for p in sorted(Path(argv[0]).glob("cpu-*.json"))]
    per_test: dict[str, float] = {}
    per_phase: dict[str, float] = defaultdict(float)
    per_module: dict[str, float] = defaultdict(float)
    per_fixture: dict[str, float] = defaultdict(float)
    fixture_count: dict[str, int] = defaultdict(int)
    for run in runs:
        print(f"{run['worker']}: own {run['own']:.1f} s, children {run['children']:.1f} s")
        for nodeid, phases in run["tests"].items():
            total = sum(sum(v) for v in phases.values())
            per_test[nodeid] = total
            per_module[_module(nodeid)] += total
            for phase, (own, children) in phases.items():
                per_phase[f"{phase} own"] += own
                per_phase[f"{phase} children"] += children
        for f in run["fixtures"]:
            per_fixture[f"{f['fixture']} ({f['scope']})"] += f["cpu"]
            fixture_count[f"{f['fixture']} ({f['scope']})"] += 1
    print(f"\nin tests: {sum(per_test.values()):.1f} s of CPU over {len(per_test)} tests")
    for phase, seconds in sorted(per_phase.items()):
        print(f"  {phase:<20} {seconds:8.1f} s")
    print("\nby test:")
    for nodeid, seconds in sorted(per_test.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {seconds:7.2f}  {nodeid}")
    print("\nby module:")
    for module, seconds in sorted(per_module.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {seconds:7.2f}  {module}")
    print("\nby fixture (own setup only, summed; count):")
    for name, seconds in sorted(per_fixture.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {seconds:7.2f}  {fixture_count[name]:5d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
