"""`agentmesh serve` (one service, as a container runs it) and `agentmesh up` (all five locally).

`up` runs each service as a child process — the same `agentmesh serve NAME` a container
runs — so a crash in one is seen, and Ctrl-C or SIGTERM stops every child.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentmesh.cli.common import EXIT_OK, EXIT_SERVER_ERROR, EXIT_USAGE, CliError, load_settings
from agentmesh.config import SERVICES, ConfigError, Settings
from agentmesh.gateway.settings import GatewaySettings
from agentmesh.logs import configure_logging, secrets_of
from agentmesh.rpc.launch import build_service
from agentmesh.rpc.server import PortInUse

STARTUP_TIMEOUT_S = 60.0


def register(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run one service in the foreground (what a container runs)")
    serve.add_argument("service", choices=SERVICES)
    serve.set_defaults(func=run_serve)

    up = subparsers.add_parser("up", help="run all five services locally; Ctrl-C stops them all")
    up.add_argument("--logs", choices=("terminal", "files"), default="terminal",
                    help="where service logs go (files: $AGENTMESH_HOME/logs/<service>.log)")
    up.set_defaults(func=run_up)


async def run_serve(args) -> int:
    settings = load_settings()
    configure_logging(args.service, settings.log_level, secrets=secrets_of(settings))
    try:
        host = await build_service(args.service, settings)
        await host.serve_forever()
    except PortInUse as exc:
        raise CliError(str(exc)) from None
    except ConfigError as exc:
        raise CliError(f"configuration error: {exc}", EXIT_USAGE) from None
    return EXIT_OK


def port_of(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def port_is_free(address: str) -> bool:
    host, port = port_of(address)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@dataclass
class LocalStack:
    """Five `agentmesh serve` children sharing one environment."""

    env: Mapping[str, str]
    log_dir: Path | None = None
    children: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    @property
    def console_url(self) -> str:
        """The web console (and HTTP API) of the gateway, or "" when HTTP is turned off."""
        address = GatewaySettings.from_env(self.env).http_address
        if not address:
            return ""
        host, port = port_of(address)
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"

    def check_ports(self) -> None:
        listeners = dict(self.settings.addresses)
        if http := GatewaySettings.from_env(self.env).http_address:
            listeners["gateway HTTP"] = http
        taken = [f"{name} {addr}" for name, addr in listeners.items() if not port_is_free(addr)]
        if taken:
            raise CliError(
                "cannot start: address already in use — " + ", ".join(taken)
                + ". Stop what holds it (another `agentmesh up`?) or set AGENTMESH_<SERVICE>_ADDR"
                " (AGENTMESH_GATEWAY_HTTP_ADDR for the console; 'off' turns it off)."
            )

    def start(self) -> None:
        self.check_ports()
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in SERVICES:
            out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir else None  # noqa: SIM115
            self.children[name] = subprocess.Popen(
                [sys.executable, "-m", "agentmesh.cli.main", "serve", name],
                env=dict(self.env),
                stdout=out or None,
                stderr=out or None,
                # Own process group: the terminal's Ctrl-C reaches us, and we stop children in order.
                start_new_session=True,
            )

    async def wait_healthy(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        for name, address in self.settings.addresses.items():
            async with grpc.aio.insecure_channel(address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while True:
                    child = self.children[name]
                    if child.poll() is not None:
                        raise CliError(f"the {name} service exited during start-up (code {child.returncode})"
                                       + (f"; see {self.log_dir / (name + '.log')}" if self.log_dir else ""))
                    try:
                        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                        if reply.status == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.aio.AioRpcError:
                        pass
                    if time.monotonic() > deadline:
                        raise CliError(f"the {name} service did not become healthy within {timeout_s:.0f}s")
                    await asyncio.sleep(0.2)

    def exited(self) -> str | None:
        for name, child in self.children.items():
            if child.poll() is not None:
                return name
        return None

    def stop(self, grace_s: float = 25.0) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


async def run_up(args) -> int:
    settings = load_settings()
    stack = LocalStack(os.environ.copy(), log_dir=settings.home / "logs" if args.logs == "files" else None)
    stack.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stack.wait_healthy()
        print("agentmesh is up:")
        for name, address in settings.addresses.items():
            print(f"  {name:<10} {address}")
        if stack.console_url:
            print(f"  {'console':<10} {stack.console_url}  (web console and HTTP API)")
        print(f"data in {settings.home} · model: {settings.llm.provider} · sandbox: {settings.sandbox}")
        print("try: agentmesh chat \"hello\" --session work   ·   Ctrl-C stops everything", flush=True)
        while not stop.is_set():
            crashed = stack.exited()
            if crashed:
                sys.stderr.write(f"agentmesh: the {crashed} service exited unexpectedly; stopping the stack\n")
                return EXIT_SERVER_ERROR
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            except TimeoutError:
                pass
        print("stopping…", flush=True)
        return EXIT_OK
    finally:
        await asyncio.to_thread(stack.stop)
