"""What every CLI command shares: settings, channels, and turning failures into exit codes.

Every command module imports this one, and `agentmesh chat --help` imports the chat module: so
nothing heavy at the top here. gRPC, protobuf and the settings are imported by the functions that
use them, when a command runs (main.py).
"""

from __future__ import annotations

import sys

# typing.TYPE_CHECKING without importing typing, a few ms of every `--help` (mypy reads any
# name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import grpc

    from agentmesh.config import Settings

# The exit codes every command keeps (docs/architecture.md, "The command line").
EXIT_OK = 0
EXIT_SERVER_ERROR = 1  # an error the server reported, or a service that could not be reached
EXIT_USAGE = 2  # the command line or the configuration is wrong; nothing was sent
EXIT_LIMIT = 3  # a turn stopped at its step or token limit: it ended, but short of an answer
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports a process SIGINT ended)

CALL_TIMEOUT_S = 30.0
# A command waits this long for a service that is (re)starting; longer, and "is `agentmesh up`
# running?" would take too long to say.
WAIT_FOR_SERVICE_S = 3.0


class CliError(Exception):
    """An error to print in plain words, with its exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_SERVER_ERROR):
        super().__init__(message)
        self.exit_code = exit_code


def load_settings() -> Settings:
    from agentmesh.config import ConfigError, Settings

    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise CliError(f"configuration error: {exc}", EXIT_USAGE) from None


def channel_to(settings: Settings, service: str) -> grpc.aio.Channel:
    from agentmesh.rpc.client import open_channel

    return open_channel(settings.address_of(service), wait_for_peer_s=WAIT_FOR_SERVICE_S)


def stored_token(settings: Settings) -> str:
    """The token `agentmesh login` stored, or ""."""
    try:
        return settings.credentials_file.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""
    except OSError as exc:
        raise CliError(f"cannot read the stored token at {settings.credentials_file}: {exc.strerror}") from None


def call_metadata(settings: Settings) -> tuple[tuple[str, str], ...]:
    """The user's credentials (AGENTMESH_AUTH_TOKEN, else the token `agentmesh login` stored),
    on every call the CLI makes: to the gateway and scheduler, and to the user-facing methods
    of memory and tools."""
    return bearer_metadata(settings.client_token or stored_token(settings))


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """`authorization: Bearer <token>` (nothing without a token), as agentmesh.rpc.auth reads
    it. Written out here rather than imported from there: that module brings JWT, OpenTelemetry
    and the access policy with it, which a command that only sends a token does not need."""
    return (("authorization", f"Bearer {token}"),) if token else ()


async def gateway_call(method: str, request, *, settings: Settings | None = None, timeout: float = 30.0):
    """The gateway's RPC `method` with `request`, as the stored token; a failure as a CliError."""
    return await service_call("gateway", method, request, settings=settings, timeout=timeout)


async def service_call(service: str, method: str, request, *, settings: Settings | None = None,
                       timeout: float = 30.0):
    """`service`'s (gateway or tools) RPC `method` with `request`, as the stored token, through the
    service's one client; a failure as a CliError that says what to do."""
    import grpc

    from agentmesh.clients.gateway import GatewayClient
    from agentmesh.clients.tools import ToolsClient

    client = {"gateway": GatewayClient, "tools": ToolsClient}[service]
    settings = settings or load_settings()
    async with channel_to(settings, service) as channel:
        try:
            return await getattr(client(channel).stub, method)(
                request, metadata=call_metadata(settings), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise rpc_failure(err, service, settings) from None


def rpc_failure(err: grpc.aio.AioRpcError, service: str, settings: Settings) -> CliError:
    """A server's status as a sentence: unreachable services get a hint about how to start them."""
    import grpc

    if err.code() == grpc.StatusCode.UNAVAILABLE and "connect" in (err.details() or "").lower():
        return CliError(
            f"cannot reach the {service} service at {settings.address_of(service)}: "
            f"is `agentmesh up` running? (set AGENTMESH_{service.upper()}_ADDR to point elsewhere)"
        )
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        return CliError(f"the {service} service is unavailable: {err.details()}")
    return CliError(f"{err.details() or err.code().name} ({err.code().name})")


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}", EXIT_USAGE) from None
    if not isinstance(value, dict):
        raise CliError(f"{what} must be a JSON object, like '{{\"command\": \"ls\"}}'", EXIT_USAGE)
    return value


def to_dict(message) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def print_json(value: Any) -> None:
    import json

    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")
    sys.stdout.flush()
