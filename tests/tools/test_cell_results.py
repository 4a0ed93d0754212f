"""Rich results of `python` cells in a session sandbox, through the real tools service over gRPC
with real bubblewrap jails: a figure the cell draws comes back as an image of the result (stored
once under `.attachments/`), bounded in count and size and PNG only; a pandas DataFrame as the
cell's last expression comes back as a Markdown table and a CSV file."""

from __future__ import annotations

import base64
import shutil
import subprocess

import pytest

from agentmesh.tools.sandbox.local import SANDBOX_PATH
from tests.support.pictures import png
from tests.tools.support import ToolsClient

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")

SESSION = {"AGENTMESH_SANDBOX_ISOLATION": "session"}


def jail_has(module: str) -> bool:
    """Whether the jail's Python (the first python3 on the jail's PATH, the host's system one;
    not the python3 the tests run with, which may be a venv's or pyenv's) can import `module`.
    Found, not imported: this runs when every worker collects, and importing pandas and matplotlib
    took a second of each one's start."""
    python = shutil.which("python3", path=SANDBOX_PATH)
    found = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return bool(python) and subprocess.run([python, "-c", found], capture_output=True).returncode == 0


def write_png(path: str, data: bytes) -> str:
    """A cell that writes `data` to `path` with the standard library only."""
    return (f"import base64, os\nos.makedirs(os.path.dirname({path!r}) or '.', exist_ok=True)\n"
            f"open({path!r}, 'wb').write(base64.b64decode({base64.b64encode(data).decode()!r}))\n")


@pytest.fixture
async def session(home):
    async with ToolsClient(home, SESSION) as client:
        yield client


async def test_a_png_the_cell_writes_comes_back_as_an_image(session):
    picture = png(6, 5, shade=90)
    result = await session.call("python", {"code": write_png(".outputs/plot.png", picture)})
    assert not result.is_error, result.output
    assert "[figures saved: .outputs/plot.png]" in result.output
    (image,) = result.images
    assert (image.name, image.media_type, image.width, image.height, image.size_bytes) == (
        "plot.png", "image/png", 6, 5, len(picture))
    # By reference: the bytes are stored once in the workspace, not carried in the result.
    assert image.data == b"" and image.path.startswith(".attachments/")
    assert session.workspace("s1").joinpath(image.path).read_bytes() == picture

    again = await session.call("python", {"code": "print('no new figure')"})
    assert list(again.images) == [] and "figures saved" not in again.output


async def test_figures_past_the_count_and_not_png_are_named_not_shown(home):
    async with ToolsClient(home, {**SESSION, "AGENTMESH_TOOLS_MAX_CELL_IMAGES": "2"}) as tools:
        code = "".join(write_png(f".outputs/f{i}.png", png(2, 2, shade=i)) for i in range(3))
        code += "open('.outputs/fake.png', 'w').write('not a picture')\n"
        result = await tools.call("python", {"code": code})
    assert not result.is_error, result.output
    # The kernel names them in order (f0, f1, f2, fake); the first two are shown.
    assert [image.name for image in result.images] == ["f0.png", "f1.png"]
    assert ("[2 more figure(s) not shown, at most 2 per call (AGENTMESH_TOOLS_MAX_CELL_IMAGES): "
            ".outputs/f2.png, .outputs/fake.png; read_file shows one]") in result.output


async def test_a_figure_over_the_image_limit_is_named_not_shown(home):
    async with ToolsClient(home, {**SESSION, "AGENTMESH_TOOLS_MAX_IMAGE_BYTES": "1024"}) as tools:
        code = write_png("small.png", png(2, 2)) + "os.makedirs('.outputs')\nopen('.outputs/big.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + bytes(5000))\n"
        result = await tools.call("python", {"code": code})
    assert [image.name for image in result.images] == ["small.png"]
    assert "[figure .outputs/big.png is not shown: 5008 bytes, over the 1024-byte limit for images" in result.output


@pytest.mark.skipif(not jail_has("matplotlib"), reason="the host's python3 has no matplotlib "
                    "(scripts/system-packages.sh installs python3-matplotlib)")
async def test_a_matplotlib_figure_arrives_as_an_image(session):
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 1])\nplt.title('rising')\n"
    result = await session.call("python", {"code": code, "timeout_s": 120})
    assert not result.is_error, result.output
    assert "[figures saved: .outputs/figure-1.png]" in result.output
    (image,) = result.images
    assert image.media_type == "image/png" and image.width > 100 and image.height > 100
    assert session.workspace("s1").joinpath(image.path).read_bytes().startswith(b"\x89PNG")


@pytest.mark.skipif(not jail_has("pandas"), reason="the host's python3 has no pandas "
                    "(scripts/system-packages.sh installs python3-pandas)")
async def test_a_dataframe_comes_back_as_a_table_and_a_csv_file(session):
    code = "import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3.5, 19.0]})\ndf\n"
    result = await session.call("python", {"code": code, "timeout_s": 120})
    assert not result.is_error, result.output
    assert result.output.splitlines()[:4] == ["|  | city | temp |", "|---|---|---|", "| 0 | Oslo | 3.5 |", "| 1 | Lima | 19.0 |"]
    assert "[table saved as CSV: .outputs/table-1.csv]" in result.output
    assert session.workspace("s1").joinpath(".outputs/table-1.csv").read_text() == ",city,temp\n0,Oslo,3.5\n1,Lima,19.0\n"

    big = await session.call("python", {"code": "pd.DataFrame({'n': range(100)})"})
    assert "[100 rows × 1 columns; shown: the first 30 rows and 1 columns]" in big.output
    assert "| 29 | 29 |" in big.output and "| 30 | 30 |" not in big.output
    assert len(session.workspace("s1").joinpath(".outputs/table-2.csv").read_text().splitlines()) == 101

    # A cell's own pipe is escaped and its line breaks joined: each row stays one table row.
    odd = await session.call("python", {"code": "pd.DataFrame({'t': ['a|b', 'two\\nlines']})"})
    assert odd.output.splitlines()[2:4] == ["| 0 | a\\|b |", "| 1 | two lines |"]
