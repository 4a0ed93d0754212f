"""The generated gRPC stubs must match protos/: a stale stub fails here, not in production."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "protos"
STUB_DIR = ROOT / "lib" / "agentmesh" / "v1"


def test_generated_stubs_are_fresh(tmp_path):
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "agentmesh" / "v1").glob("*.proto"))
    assert protos, "no protos found"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos],
        check=True, cwd=PROTO_DIR,
    )
    fresh_dir = tmp_path / "agentmesh" / "v1"
    fresh = sorted(p.name for p in fresh_dir.iterdir())
    present = sorted(p.name for p in STUB_DIR.iterdir() if p.name.endswith((".py", ".pyi")) and "_pb2" in p.name)
    assert present == fresh, "generated files differ from the protos: run `make stubs`"
    stale = [name for name in fresh if not filecmp.cmp(fresh_dir / name, STUB_DIR / name, shallow=False)]
    assert stale == [], f"stale generated code {stale}: run `make stubs`"
