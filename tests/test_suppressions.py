"""Every `noqa` and `type: ignore` in the product code says why it is there: a suppression
without a reason hides whether the check was wrong or the code is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The directive, its codes, then nothing but blanks to the end of the line: no reason given.
BARE = re.compile(r"#\s*(noqa(:\s*[A-Z0-9, ]+)?|type:\s*ignore(\[[a-z0-9, -]+\])?)\s*$")


def test_every_suppression_gives_its_reason():
    bare = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for folder in ("lib", "services", "cli") for path in sorted((ROOT / folder).rglob("*.py"))
            if "/v1/" not in path.as_posix()  # protoc's output
            for number, line in enumerate(path.read_text().splitlines(), 1) if BARE.search(line)]
    assert bare == []
