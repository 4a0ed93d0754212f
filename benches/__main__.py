"""Run every benchmark module in this folder, one after the other, each in its own process."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    names = sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if not m.name.startswith("_"))
    selected = sys.argv[1:] or names
    failed = []
    for name in selected:
        print(f"\n=== benches.{name} ===", flush=True)
        if subprocess.run([sys.executable, "-m", f"benches.{name}"], cwd=HERE.parent).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
