"""Contenders in child processes, each under an interpreter of its own, measured in alternating rounds.

A bench that compares checkouts (`--before-python`) runs each contender as a child: the bench's
own file, by path, under that checkout's interpreter and from outside any checkout, so the child
imports that interpreter's install of agentmesh — its client code and its services. The parent
asks each child for one round at a time, in turn, so the load of a shared machine falls on all of
them alike.

The children run this checkout's bench file under another checkout's interpreter, where the
`benches` package is not importable; Python puts the directory of a script run by path first on
`sys.path`, so they import this module by its plain name (`import _contenders`) while the parent
imports `benches._contenders`. It must therefore import nothing of agentmesh, nor of `benches`.
(The leading underscore keeps `make bench` from running it as a bench of its own.)

Parent::

    children = {name: start(python, __file__, ["--child", ...]) for name, python in pythons.items()}
    results = alternate(children, rounds, TAG)          # {name: [round result, ...]}

Child::

    await serve_rounds(TAG, measure)                    # one `await measure()` per round asked for
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Mapping

__all__ = ["alternate", "cpu_s", "free_address", "serve_rounds", "service", "start"]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


# --- the parent's side ---------------------------------------------------------------------------

def start(python: str, script: str, argv: list[str]) -> subprocess.Popen:
    """`script` run by `python` as a contender, waiting for rounds to be asked of it."""
    # From outside any checkout, so that the interpreter's own install of agentmesh is used.
    return subprocess.Popen([python, str(Path(script).resolve()), *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())


def alternate(children: Mapping[str, subprocess.Popen], rounds: int, tag: str) -> dict[str, list[dict[str, Any]]]:
    """`rounds` rounds of every child, each round starting with the next child in turn; the
    children are then told to end (stdin closed) and waited for."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in children}
    try:
        names = list(children)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                results[name].append(_round(children[name], tag))
    finally:
        for child in children.values():
            if child.stdin:
                with contextlib.suppress(BrokenPipeError):  # a child that failed has said why on stderr
                    child.stdin.close()
        for child in children.values():
            child.wait(60)
    return results


def _round(child: subprocess.Popen, tag: str) -> dict[str, Any]:
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write("go\n")
        child.stdin.flush()
    except BrokenPipeError:
        raise RuntimeError("a contender stopped before measuring (its error is above)") from None
    while True:
        line = child.stdout.readline()
        if not line:
            raise RuntimeError("a contender stopped before measuring")
        if line.startswith(tag):
            return dict(json.loads(line[len(tag):]))


# --- the child's side ----------------------------------------------------------------------------

async def serve_rounds(tag: str, measure: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """One round for each line the parent writes, its result printed after `tag`, until stdin closes."""
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(tag + json.dumps(await measure()), flush=True)


@contextlib.contextmanager
def service(name: str, env: Mapping[str, str]) -> Iterator[subprocess.Popen]:
    """`agentmesh serve <name>` under this interpreter, stopped on leaving."""
    process = subprocess.Popen([sys.executable, "-m", "agentmesh.cli.main", "serve", name], env=dict(env))
    try:
        yield process
    finally:
        process.terminate()
        process.wait(30)
