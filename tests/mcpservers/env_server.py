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


if __name__ == "__main__":
    server.run("stdio")
