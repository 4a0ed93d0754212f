import shutil
import tempfile
from pathlib import Path

import pytest

from tests.tools.support import ToolsClient


@pytest.fixture
def home():
    """AGENTMESH_HOME on a path other users can traverse, as a deployment's would be.

    When the suite runs as root, this lets the jail drop to an unprivileged host uid (pytest's own
    tmp_path lives under a 0700 directory, which would force the root fallback).
    """
    base = Path(tempfile.mkdtemp(prefix="agentmesh-tools-", dir="/tmp"))
    base.chmod(0o711)
    yield base / "home"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def tools(home):
    async with ToolsClient(home) as client:
        yield client
