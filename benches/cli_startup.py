"""How long a whole `agentmesh` command takes, from exec to exit, against `python -c pass`.

Each command runs as a user runs it — the installed `agentmesh` script next to this interpreter —
under hyperfine, with `python -c pass` (the interpreter's own start) as the baseline in the same
run, so the load of a shared machine falls on every row alike; the table gives each command's
time and its ratio to the baseline. The RPC commands run against a local stack (`agentmesh up`'s
five services, the scripted model) this bench starts on free ports and stops.

    python -m benches.cli_startup [--runs 30] [--warmup 3] [--before REV]

`--before REV` adds each command as it was at git revision REV, in the same run: REV's `cli/`,
`lib/` and `services/` laid out as the installed package in a temporary directory that leads
PYTHONPATH (this checkout's generated stubs copied in). Every row then runs through `env`, so
both sides pay the same exec.

Needs hyperfine (Debian: `sudo apt-get install -y hyperfine`); without it, it says so and stops.
Goals (docs/architecture.md, "The command line"): `--help` and `chat --help` within 2x the
baseline; a one-shot RPC command (`sessions list`) within 0.4 s on a quiet machine.

Measured 2026-11-28 06:31-06:38 UTC on a 2-core VM shared with other builds (load 10-12, so
medians swing run to run; hyperfine runs one command's rounds together, so read the ratios
and the minima more than single medians). `--runs 40 --warmup 5 --before 391892b` (before: the
commit this work started from):

| command | median | min | x python -c pass (median) | before: median | min | x |
|---|---|---|---|---|---|---|
| `python -c pass` | 96 ms | 36 ms | 1.00x | | | |
| `agentmesh --help` | 118 ms | 79 ms | 1.24x | 1908 ms | 811 ms | 19.96x |
| `agentmesh chat --help` | 161 ms | 56 ms | 1.69x | 2243 ms | 925 ms | 23.45x |
| `agentmesh sessions list` | 1195 ms | 292 ms | 12.50x | 1534 ms | 604 ms | 16.05x |
| `agentmesh memory search` | 609 ms | 283 ms | 6.37x | 1461 ms | 712 ms | 15.27x |

The help rows alone, 60 runs each (hyperfine -N, same load): `python -c pass` 74.9 ms median
(42.6 min), `agentmesh --help` 126.7 (45.9) = 1.69x, `agentmesh chat --help` 123.0 (47.2) = 1.64x.
What is left in an RPC command is what it needs: gRPC, the protobuf stubs, asyncio and the
settings (which load every service's section, to refuse a bad configuration with exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agentmesh.cli.stack import LocalStack, free_address
from agentmesh.config import SERVICES

AGENTMESH = str(Path(sys.executable).with_name("agentmesh"))
BASELINE = "python -c pass"
COMMANDS = [
    (BASELINE, [sys.executable, "-c", "pass"]),
    ("agentmesh --help", [AGENTMESH, "--help"]),
    ("agentmesh chat --help", [AGENTMESH, "chat", "--help"]),
    ("agentmesh sessions list", [AGENTMESH, "sessions", "list"]),
    ("agentmesh memory search", [AGENTMESH, "memory", "search", "hello"]),
]
ROOT = Path(__file__).resolve().parent.parent
SERVICE_PACKAGES = ("gateway", "agent", "tools", "memory", "scheduler")


def tree_at(rev: str, into: Path) -> Path:
    """REV's code as the installed `agentmesh` package (pyproject's package-dir), under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cli", "lib", "services"],
                             check=True, capture_output=True).stdout
    source = into / "source"
    source.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    package = into / "tree" / "agentmesh"
    shutil.copytree(source / "lib" / "agentmesh", package)
    shutil.copytree(source / "cli", package / "cli")
    for name in SERVICE_PACKAGES:
        shutil.copytree(source / "services" / name, package / name)
    for stub in (ROOT / "lib" / "agentmesh" / "v1").glob("*_pb2*.py"):  # generated, not in git
        shutil.copy2(stub, package / "v1" / stub.name)
    return into / "tree"


def _quoted(argv: list[str]) -> str:
    return " ".join(arg if arg.replace("/", "").replace("-", "").replace(".", "").replace("_", "").isalnum()
                    else f"'{arg}'" for arg in argv)


def measure(env: dict[str, str], runs: int, warmup: int, before: tuple[str, Path] | None = None) -> list[dict]:
    rows = [(name, argv) for name, argv in COMMANDS]
    if before is not None:
        rev, tree = before
        rows = [(name, ["env", *argv]) for name, argv in rows]
        rows += [(f"{name} @{rev}", ["env", f"PYTHONPATH={tree}", *argv]) for name, argv in COMMANDS if name != BASELINE]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = ["hyperfine", "--shell=none", "--style", "basic", "--runs", str(runs), "--warmup", str(warmup),
                   "--export-json", out.name]
        for name, argv in rows:
            command += ["--command-name", name, _quoted(argv)]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())["results"]


def table(results: list[dict]) -> str:
    base = next(r for r in results if r["command"] == BASELINE)["median"]
    rows = ["| command | median | mean ± sd | min | × python -c pass (median) |", "|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| `{r['command']}` | {r['median'] * 1e3:.0f} ms | {r['mean'] * 1e3:.0f} ± {r['stddev'] * 1e3:.0f} ms "
                    f"| {r['min'] * 1e3:.0f} ms | {r['median'] / base:.2f}x |")
    return "\n".join(rows)


def machine() -> str:
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "?"
    return (f"{platform.node()} · {os.cpu_count()} cores · load {load} · Python {platform.python_version()} · "
            f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--before", metavar="REV", help="also run each command as it was at this git revision")
    args = parser.parse_args()
    if not shutil.which("hyperfine"):
        print("skipped: needs hyperfine (Debian: sudo apt-get install -y hyperfine)")
        return 0
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
        env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
        env.update({"AGENTMESH_HOME": home, "AGENTMESH_GATEWAY_HTTP_ADDR": "off", "AGENTMESH_LLM_PROVIDER": "scripted"})
        stack = LocalStack(env, log_dir=Path(home) / "logs")
        stack.start()
        try:
            asyncio.run(stack.wait_healthy())
            before = (args.before, tree_at(args.before, Path(home) / "before")) if args.before else None
            results = measure(env, args.runs, args.warmup, before)
        finally:
            stack.stop()
    print(machine())
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
