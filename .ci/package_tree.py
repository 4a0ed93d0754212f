"""Run a checker (mypy, lint-imports) over the `agentmesh` package as it is installed.

The package is assembled from several folders (`lib/agentmesh`, `services/<name>`, `cli`) by
`[tool.setuptools.package-dir]`; the editable install finds them through an import hook that
static checkers do not run. This builds the installed layout as a tree of links under
`.venv/package-tree`, runs the command with that tree first on the import path, and maps the
paths in its output back to the files in the repository.

    python .ci/package_tree.py mypy
    python .ci/package_tree.py lint-imports
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".venv" / "package-tree"
SOURCE_SUFFIXES = (".py", ".pyi", ".typed")


def build_tree() -> dict[str, str]:
    """Link every source file into its installed place; return link prefix -> source prefix."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    prefixes = {}
    # Shortest package first, so that a sub-package's folder is linked over its parent's.
    for package, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        source = ROOT / folder
        target = TREE.joinpath(*package.split("."))
        prefixes[str(target.relative_to(ROOT))] = folder
        for path in source.rglob("*"):
            if path.suffix not in SOURCE_SUFFIXES or "__pycache__" in path.parts:
                continue
            link = target / path.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
    return prefixes


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    prefixes = build_tree()
    env = dict(os.environ, PYTHONPATH=str(TREE), MYPYPATH=str(TREE))
    command = [str(Path(sys.executable).parent / argv[0]), *argv[1:]]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    # Longest prefix first: `.venv/package-tree/agentmesh/agent` before `.venv/package-tree/agentmesh`.
    for stream, output in ((sys.stdout, done.stdout), (sys.stderr, done.stderr)):
        for link, folder in sorted(prefixes.items(), key=lambda item: -len(item[0])):
            output = output.replace(link + "/", folder + "/")  # noqa: PLW2901 - rewritten in place
        stream.write(output)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
