"""gRPC server bootstrap shared by all services: health, reflection, tracing, graceful drain.

A service builds a `ServiceHost`, adds its servicers, registers clean-up with `on_stop`, and
either `start()`s it (tests, `agentmesh up` in-process) or runs `serve_forever()` (a container),
which drains in-flight RPCs on SIGTERM/SIGINT before exiting.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import signal
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agentmesh.config import SERVICES, Settings
from agentmesh.logs import get_logger
from agentmesh.rpc.audit import AuditLog
from agentmesh.rpc.auth import CallerCheck
from agentmesh.rpc.calls import ServerCalls
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.limits import DEFAULT_MAX_RECEIVE_BYTES, MAX_MESSAGE_BYTES, MIB
from agentmesh.rpc.users import UserAuthenticator
from agentmesh.telemetry import Telemetry

__all__ = ["DEFAULT_MAX_RECEIVE_BYTES", "MAX_MESSAGE_BYTES", "MIB", "PortInUse", "ServiceHost", "raise_open_files_limit"]

log = get_logger("agentmesh.rpc")


_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Refuse a second server on a taken port instead of silently sharing it.
    ("grpc.so_reuseport", 0),
]


class PortInUse(RuntimeError):
    pass


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit; the limits after.

    Every turn in flight holds descriptors — the agent a connection to the model, the gateway
    and the tools service a stream or a process each — and the soft limit many systems start
    processes with (1024) ends a burst of a thousand turns with EMFILE ("too many open files")
    where nothing else would stop it. The hard limit is the administrator's bound; the soft one
    is only a default that a process may raise to it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # kept as it was: the service still runs, with the lower limit
    return soft, hard


class ServiceHost:
    def __init__(
        self,
        service: str,
        settings: Settings,
        telemetry: Telemetry,
        *,
        address: str | None = None,
        interceptors: list[grpc.aio.ServerInterceptor] | None = None,
        identity: ServiceIdentity | None = None,
        max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    ):
        self.service = service
        self.settings = settings
        self.telemetry = telemetry
        self.address = address or settings.bind_address(service)
        # Every agentmesh service checks who calls it (agentmesh.rpc.auth); its own identity
        # signs the calls it makes (`identity`, shared with its channels).
        if identity is None and service in SERVICES:
            identity = ServiceIdentity.open(service, settings.keys_dir)
        self.identity = identity
        # Who did what (sessions, approvals, cron, refused sign-ins, cross-tenant attempts).
        self.audit = AuditLog(service, Path(settings.audit_log).expanduser() if settings.audit_log else None)
        self.users = UserAuthenticator(settings.auth_policy)
        callers = CallerCheck(service, identity, self.users, self.audit) if identity else None
        # The span, rpc.server.duration, the caller check and the malformed-request guard of
        # every call, in one interceptor (calls.py); also of calls carried on a stream (carried.py).
        self.calls = ServerCalls(telemetry.tracer_provider.get_tracer("agentmesh.rpc"), telemetry.metrics, callers)
        self.server = grpc.aio.server(
            interceptors=[
                self.calls,
                *(interceptors or []),
            ],
            options=[*_SERVER_OPTIONS, ("grpc.max_receive_message_length", max_receive_bytes),
                     # Reap connections that carry no call (a client that connects and waits, or
                     # never finishes the handshake): grpc keeps them forever otherwise.
                     ("grpc.max_connection_idle_ms", int(settings.rpc_server.idle_s * 1000)),
                     ("grpc.server_handshake_timeout_ms", int(settings.rpc_server.handshake_timeout_s * 1000))],
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._service_names: list[str] = []
        self._on_start: list[Callable[[], Awaitable[Any]]] = []
        self._on_stop: list[Callable[[], Awaitable[Any]]] = []
        self._on_drain: list[Callable[[float], Awaitable[Any]]] = []
        self.port: int = 0
        # Other listeners the service serves beside gRPC, by name ("http": "127.0.0.1:8080").
        self.endpoints: dict[str, str] = {}
        self._stopped = asyncio.Event()

        async def close_auth() -> None:
            await self.users.close()
            self.audit.close()

        self._on_stop.append(close_auth)  # runs last: on_stop callbacks run in reverse

    def add(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        """Register a servicer, e.g. `host.add(add_ToolsServicer_to_server, servicer, "agentmesh.internal.v1.Tools")`."""
        register(servicer, self.server)
        self._service_names.append(full_name)

    def on_drain(self, callback: Callable[[float], Awaitable[Any]]) -> None:
        """Run `callback(grace_s)` while the server drains, e.g. to end long streams with a reason
        before the grace period runs out and they are cut."""
        self._on_drain.append(callback)

    def on_start(self, callback: Callable[[], Awaitable[Any]]) -> None:
        """Run `callback` once the gRPC server listens (e.g. a second listener that calls it)."""
        self._on_start.append(callback)

    def on_stop(self, callback: Callable[[], Awaitable[Any]]) -> None:
        """Run `callback` after the server stopped accepting and drained (close clients, stores)."""
        self._on_stop.append(callback)

    @property
    def target(self) -> str:
        """Where a client on this machine reaches the host."""
        host = self.address.rpartition(":")[0]
        if host in ("0.0.0.0", "[::]", ""):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    async def start(self) -> "ServiceHost":
        raise_open_files_limit()
        names = [*self._service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.server)
        try:
            self.port = self.server.add_insecure_port(self.address)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            # What the build opened is let go (the embedded memory store's lock among it), so the
            # same process can build the service again on another port.
            await self._clean_up()
            raise PortInUse(f"cannot listen on {self.address}: the port is taken or the address is invalid")
        # grpc's health servicer says SERVING for the server as a whole ("") from the start; a
        # client waiting for it (`agentmesh up`, a readiness probe) must not be told so while the
        # start callbacks (the gateway's HTTP listener among them) still run.
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        try:
            for callback in self._on_start:
                await callback()
        except BaseException:
            await self.server.stop(0)
            await self._clean_up()
            raise
        for name in ["", *self._service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("service started", address=self.address, port=self.port)
        return self

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking new RPCs, let in-flight ones finish for `grace` seconds, then clean up."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.settings.drain_s if grace is None else grace
        await self.health.enter_graceful_shutdown()
        log.info("service draining", grace_s=grace)
        drains = [asyncio.ensure_future(callback(grace)) for callback in self._on_drain]
        await self.server.stop(grace)
        for task in drains:
            if not task.done():
                task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        await self._clean_up()
        self.telemetry.force_flush()
        log.info("service stopped")

    async def _clean_up(self) -> None:
        for callback in reversed(self._on_stop):
            try:
                await callback()
            except Exception:  # clean-up must carry on
                log.exception("clean-up failed")

    async def serve_forever(self) -> None:
        """Start, then block until SIGTERM or SIGINT, then drain and stop."""
        await self.start()
        # What exists once the service started (modules, settings, stubs, the store) lives as
        # long as the process: frozen, the collector's full passes no longer walk it. A full
        # pass over the memory service's ~140k start-up objects took ~0.4 s under load (a
        # pause of every call in flight), 1-2 ms once frozen.
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_requested.set)
        await stop_requested.wait()
        await self.stop()
        self.telemetry.shutdown()
