"""edit_file, glob, grep and web_fetch through the Tools API."""

from __future__ import annotations

import pytest

from tests.tools.support import ToolsClient
from tests.tools.web_server import WebServer, body, redirect

PAGE = """<html><head><title>Release notes</title><style>p{color:red}</style></head>
<body><nav>Home | Docs</nav><h1>agentmesh 1.0</h1><p>Sandboxed tools.</p><script>alert('x')</script>
<p>Second   paragraph.</p></body></html>"""


async def seed(tools):
    files = {
        "src/app.py": "import os\n\ndef main():\n    print('hello')\n",
        "src/util/helpers.py": "def helper():\n    return 42\n",
        "README.md": "# demo\nhello world\n",
    }
    for path, content in files.items():
        result = await tools.call("write_file", {"path": path, "content": content})
        assert not result.is_error, result.output


async def test_edit_file_replaces_one_exact_match(tools):
    await seed(tools)
    result = await tools.call("edit_file", {"path": "src/app.py", "old": "print('hello')", "new": "print('bye')"})
    assert not result.is_error, result.output
    assert "line 4" in result.output
    assert "print('bye')" in (tools.workspace("s1") / "src/app.py").read_text()


@pytest.mark.parametrize(
    "old,kind", [("print('nope')", "no_match"), ("e", "ambiguous_match")]
)
async def test_edit_file_needs_exactly_one_match(tools, old, kind):
    await seed(tools)
    before = (tools.workspace("s1") / "src/app.py").read_text()
    result = await tools.call("edit_file", {"path": "src/app.py", "old": old, "new": "x"})
    assert result.is_error and result.error_kind == kind
    assert (tools.workspace("s1") / "src/app.py").read_text() == before


async def test_read_file_pages_by_line(tools):
    await tools.call("write_file", {"path": "n.txt", "content": "".join(f"{i}\n" for i in range(1, 11))})
    result = await tools.call("read_file", {"path": "n.txt", "offset": 4, "limit": 3})
    assert result.output.startswith("4\n5\n6\n")
    assert "offset=7" in result.output and result.truncated
    missing = await tools.call("read_file", {"path": "nope.txt"})
    assert missing.error_kind == "not_found"


async def test_glob_matches_across_directories(tools):
    await seed(tools)
    result = await tools.call("glob", {"pattern": "**/*.py"})
    assert result.output.splitlines() == ["src/app.py", "src/util/helpers.py"]
    top = await tools.call("glob", {"pattern": "*.md"})
    assert top.output == "README.md"
    escape = await tools.call("glob", {"pattern": "../*"})
    assert escape.error_kind == "path_escape"


async def test_glob_and_grep_do_not_follow_symlinks_out(tools):
    await seed(tools)
    await tools.call("shell", {"command": "ln -s / root; ln -s /etc etc"})
    found = await tools.call("glob", {"pattern": "**/passwd"})
    assert "passwd" not in found.output.replace("no files match '**/passwd'", "")
    searched = await tools.call("grep", {"pattern": "root:", "path": "."})
    assert searched.output.startswith("no matches")


async def test_grep_reports_path_line_and_text(tools):
    await seed(tools)
    result = await tools.call("grep", {"pattern": r"hel+o", "path": "."})
    assert result.output.splitlines() == ["README.md:2: hello world", "src/app.py:4:     print('hello')"]
    one = await tools.call("grep", {"pattern": "return", "path": "src/util/helpers.py"})
    assert one.output == "src/util/helpers.py:2:     return 42"
    bad = await tools.call("grep", {"pattern": "(unclosed"})
    assert bad.error_kind == "invalid_arguments"


async def test_grep_stops_a_pathological_pattern(tools):
    await tools.call("write_file", {"path": "a.txt", "content": "x" * 1000 + "\n"})
    result = await tools.call("grep", {"pattern": "(x+x+)+y"})
    assert result.is_error and result.error_kind == "timeout"


async def test_web_fetch_refuses_loopback_private_and_metadata_addresses(tools):
    with WebServer({"/": body(PAGE)}) as server:
        for url in (
            server.url + "/",
            f"http://localhost:{server.port}/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
            "http://[::1]/",
            "http://2130706433/",  # 127.0.0.1 written as one number
        ):
            result = await tools.call("web_fetch", {"url": url})
            assert result.is_error and result.error_kind == "address_refused", (url, result.output)
            assert "not a public internet address" in result.output
        assert server.hits == []


async def test_web_fetch_rejects_other_schemes(tools):
    result = await tools.call("web_fetch", {"url": "file:///etc/passwd"})
    assert result.error_kind == "invalid_arguments"


async def test_web_fetch_returns_readable_text_when_allowed(home):
    with WebServer({"/page": body(PAGE), "/data": body('{"a": 1}', "application/json")}) as server:
        async with ToolsClient(home, {"AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{server.port}"}) as tools:
            page = await tools.call("web_fetch", {"url": server.url + "/page"})
            data = await tools.call("web_fetch", {"url": server.url + "/data"})
    assert not page.is_error, page.output
    assert "Title: Release notes" in page.output
    assert "agentmesh 1.0\nSandboxed tools.\nSecond   paragraph." in page.output
    assert "alert" not in page.output and "color:red" not in page.output and "Home | Docs" not in page.output
    assert page.data["status"] == 200
    assert data.output.endswith('{"a": 1}')


async def test_web_fetch_checks_every_redirect_hop(home):
    with WebServer({"/secret": body("internal only")}) as internal:
        with WebServer({"/go": redirect(internal.url + "/secret"), "/self": redirect("/final"), "/final": body("done", "text/plain")}) as public:
            async with ToolsClient(home, {"AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{public.port}"}) as tools:
                hop = await tools.call("web_fetch", {"url": public.url + "/self"})
                refused = await tools.call("web_fetch", {"url": public.url + "/go"})
    assert not hop.is_error and hop.output.endswith("done")
    assert hop.data["url"].endswith("/final")
    assert refused.error_kind == "address_refused"
    assert internal.hits == []


async def test_web_fetch_caps_the_download(home):
    big = "<html><body>" + "<p>word</p>" * 400_000 + "</body></html>"
    with WebServer({"/big": body(big)}) as server:
        env = {"AGENTMESH_TOOLS_WEB_ALLOW": f"127.0.0.1:{server.port}", "AGENTMESH_TOOLS_WEB_MAX_BYTES": "100000"}
        async with ToolsClient(home, env) as tools:
            result = await tools.call("web_fetch", {"url": server.url + "/big", "max_chars": 1000})
    assert result.truncated and not result.is_error
    assert "truncated at 1000 characters" in result.output
    assert result.data["bytes"] == 100000
