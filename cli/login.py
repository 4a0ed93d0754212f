"""`agentmesh login --token TOKEN`: keep the user's token for every later command.

The token (a static token, a service account's, or an OIDC access/ID token) is checked against
the gateway first, then written to AGENTMESH_CREDENTIALS_FILE (default
~/.config/agentmesh/credentials) with mode 0600 — created that way, never readable by others
even for a moment. AGENTMESH_AUTH_TOKEN, when set, still wins over the stored token.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import grpc

from agentmesh.cli.common import EXIT_OK, EXIT_USAGE, CliError, bearer_metadata, channel_to, load_settings, rpc_failure
from agentmesh.clients.gateway import GatewayClient
from agentmesh.v1 import gateway_pb2


def register(subparsers) -> None:
    login = subparsers.add_parser("login", help="store your token for the CLI (mode 0600)")
    login.add_argument("--token", required=True, help="the token; '-' reads it from standard input")
    login.add_argument("--no-verify", action="store_true", help="store it without asking the gateway first")
    login.set_defaults(func=run_login)
    logout = subparsers.add_parser("logout", help="forget the stored token")
    logout.set_defaults(func=run_logout)


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, mode 0600 from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


async def run_login(args) -> int:
    settings = load_settings()
    token = (sys.stdin.readline() if args.token == "-" else args.token).strip()
    if not token or any(c.isspace() for c in token) or not token.isprintable():
        raise CliError("the token is empty or has spaces or control characters in it", EXIT_USAGE)
    if not args.no_verify:
        async with channel_to(settings, "gateway") as channel:
            try:
                await GatewayClient(channel).stub.ListModels(
                    gateway_pb2.ListModelsRequest(), metadata=bearer_metadata(token), timeout=30)
            except grpc.aio.AioRpcError as err:
                raise rpc_failure(err, "gateway", settings) from None
    write_private(settings.credentials_file, token + "\n")
    print(f"signed in; the token is stored in {settings.credentials_file} (mode 0600)")
    return EXIT_OK


async def run_logout(args) -> int:
    settings = load_settings()
    try:
        settings.credentials_file.unlink()
    except FileNotFoundError:
        print("no stored token")
        return EXIT_OK
    print(f"removed {settings.credentials_file}")
    return EXIT_OK
