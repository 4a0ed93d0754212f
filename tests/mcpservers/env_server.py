"""A stdio MCP server built with the `mcp` SDK that tells what its process sees: a variable of its
environment, whether a path exists. Run in the jail by the secret-reference tests."""

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("env")


@server.tool(description="The value of an environment variable ('' when unset).")
def getenv(name: str) -> str:
    return os.environ.get(name, "")


@server.tool(description="Whether a path exists.")
def exists(path: str) -> str:
    return "yes" if os.path.exists(path) else "no"


@server.tool(description="The command line of every process this server can see, one a line.")
def cmdlines() -> str:
    lines = []
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return "\n".join(lines)


if __name__ == "__main__":
    server.run("stdio")
