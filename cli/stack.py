"""`agentmesh serve` (one service, as a container runs it) and `agentmesh up` (all five locally).

`up` runs each service as a child process — the same `agentmesh serve NAME` a container
runs — so a crash in one is seen. Ctrl-C, SIGTERM or SIGHUP stops the children in dependency
order (`STOP_ORDER`): each is asked to drain and has exited before the next one is asked, so a
turn finishing in the gateway or agent can still save its last steps to memory. If `up` itself
dies (SIGKILL, a crash), the kernel sends each child SIGTERM (Linux `PR_SET_PDEATHSIG`), so no
service is left running on its ports.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import os
import random
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
from agentmesh.config import SERVICES, ConfigError, Settings, load
from agentmesh.gateway.settings import GatewaySettings
from agentmesh.rpc.client import open_channel

STARTUP_TIMEOUT_S = 60.0
# Callers first, what they call last: the gateway drains its turns while agent, tools and memory
# still serve them; memory, which every step is saved to, goes last.
STOP_ORDER = ("gateway", "scheduler", "agent", "tools", "memory")
# On top of the drain period, how long a service may take to exit before it is killed.
EXIT_MARGIN_S = 10.0


def register(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run one service in the foreground (what a container runs)")
    serve.add_argument("service", choices=SERVICES)
    # Set by `up` for its children: stop when that process dies (see die_with_parent).
    serve.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)
    serve.set_defaults(func=run_serve)

    up = subparsers.add_parser("up", help="run all five services locally; Ctrl-C stops them all")
    up.add_argument("--logs", choices=("terminal", "files"), default="terminal",
                    help="where service logs go (files: $AGENTMESH_HOME/logs/<service>.log)")
    up.set_defaults(func=run_up)


async def run_serve(args) -> int:
    # The services' code is imported here, in the child that serves: `up` itself only starts
    # and watches the children, and needs none of it.
    from agentmesh.logs import configure_logging, secrets_of
    from agentmesh.rpc.launch import build_service
    from agentmesh.rpc.server import PortInUse

    if args.parent_pid:
        die_with_parent(args.parent_pid)
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
        # As the servers bind: a port held only by TIME-WAIT sockets of a stopped stack is free,
        # a port with a listener is not (SO_REUSEADDR never lets two listeners share a port).
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_address() -> str:
    """A loopback address that is free now, for a service that binds it later.

    Picked below the kernel's ephemeral range: a port handed out for a bind to port 0 (another
    service's listener, an HTTP server, any outgoing connection) never lands there, so the
    address stays ours between this probe and the service's bind, and again when the service
    restarts on it. Only another process picking the same way could race us, and a random
    pick out of thousands makes that rare."""
    floor = _ephemeral_floor()
    low = min(10000, max(1024, floor - 1000))
    for _ in range(200):
        port = random.randrange(low, floor)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return f"127.0.0.1:{port}"
    with socket.socket() as probe:  # everything below the range taken: any free port will do
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel send this process SIGTERM when `parent_pid` (the `up` that started it)
    dies — SIGKILL included — so no service outlives it. Armed by the child itself after exec,
    not in a `preexec_fn`: forking a process with gRPC's threads running and running Python
    before exec crashes the child. Linux only; elsewhere a no-op."""
    libc_name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or not libc_name:
        return
    ctypes.CDLL(libc_name, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a service child, with PYTHONSAFEPATH=1: `python -m` would otherwise put the
    working directory `up` was started in first on the child's import path, so a `secrets.py`
    (or `json.py`, …) lying there would replace the standard library's module in every service.

    The variable rather than `python -P`: it is inherited, so it also covers the Python the
    services start themselves (the memory service's index builder, `python -m
    agentmesh.memory.edge_indexer`, in the same directory). Sandboxed programs never see it:
    they get a clean environment of their own (tools/sandbox/local.py)."""
    return {**env, "PYTHONSAFEPATH": "1"}


@dataclass
class LocalStack:
    """Five `agentmesh serve` children sharing one environment."""

    env: Mapping[str, str]
    log_dir: Path | None = None
    children: dict[str, subprocess.Popen] = field(default_factory=dict)
    # The interpreter the children run (benches point it at another checkout's to compare).
    python: str = sys.executable
    # Children stop when this process dies (off only for a checkout whose `serve` predates it).
    tied_to_parent: bool = True

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    @property
    def console_url(self) -> str:
        """The web console (and HTTP API) of the gateway, or "" when HTTP is turned off."""
        address = load(GatewaySettings, self.env).http_address
        if not address:
            return ""
        host, port = port_of(address)
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"

    def check_ports(self) -> None:
        listeners = dict(self.settings.addresses)
        if http := load(GatewaySettings, self.env).http_address:
            listeners["gateway HTTP"] = http
        taken = [f"{name} {addr}" for name, addr in listeners.items() if not port_is_free(addr)]
        if taken:
            raise CliError(
                "cannot start: address already in use — " + ", ".join(taken)
                + ". Stop what holds it (another `agentmesh up`?) or set AGENTMESH_<SERVICE>_ADDR"
                " (AGENTMESH_GATEWAY_HTTP_ADDR for the console; 'off' turns it off)."
            )

    def start(self) -> None:
        """Start the five children. Call it from the main thread: the kernel's parent-death
        signal follows the *thread* that forked a child, so children started from a worker
        thread would be stopped when that thread ends."""
        self.check_ports()
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in SERVICES:
            self.spawn(name)

    def spawn(self, name: str) -> subprocess.Popen:
        """Start (or start again, after it exited) the `name` child; from the main thread."""
        out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir else None  # noqa: SIM115 - closed below, once the child holds its own copy
        tie = ["--parent-pid", str(os.getpid())] if self.tied_to_parent else []
        self.children[name] = subprocess.Popen(
            [self.python, "-m", "agentmesh.cli.main", "serve", name, *tie],
            env=child_environment(self.env),
            stdout=out or None,
            stderr=out or None,
            # Own process group: the terminal's Ctrl-C reaches us, and we stop children in order.
            start_new_session=True,
        )
        if out:
            out.close()  # the child holds its own copy
        return self.children[name]

    async def wait_healthy(self, timeout_s: float = STARTUP_TIMEOUT_S, names: tuple[str, ...] = SERVICES) -> None:
        """Until each of `names` reports SERVING (or exits, or `timeout_s` passes: CliError)."""
        deadline = time.monotonic() + timeout_s
        for name in names:
            address = self.settings.address_of(name)
            # Bounded reconnect backoff: a service that is up is seen as up within a third of a second.
            async with open_channel(address, wait_for_peer_s=0) as channel:
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

    def stop(self, exit_margin_s: float = EXIT_MARGIN_S) -> None:
        """Stop in `STOP_ORDER`: SIGTERM one service, wait until it has drained and exited (killing
        it if it overruns the drain period by `exit_margin_s`), then the next."""
        grace_s = self.settings.drain_s + exit_margin_s
        for name in STOP_ORDER:
            child = self.children.get(name)
            if child is None:
                continue
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


async def _healthy_unless_stopped(stack: LocalStack, stop: asyncio.Event) -> bool:
    """Wait for the stack to be healthy; False as soon as a stop is asked for (Ctrl-C during start-up)."""
    healthy = asyncio.ensure_future(stack.wait_healthy())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({healthy, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not healthy.done():
        healthy.cancel()
        await asyncio.gather(healthy, return_exceptions=True)
        return False
    healthy.result()  # raises CliError when a service did not come up
    return True


async def run_up(args) -> int:
    settings = load_settings()
    stack = LocalStack(os.environ.copy(), log_dir=settings.home / "logs" if args.logs == "files" else None)
    stack.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP (the terminal closed) stops the stack as Ctrl-C does.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        if not await _healthy_unless_stopped(stack, stop):
            print("stopping before the stack was up…", flush=True)
            return EXIT_OK
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
        print("stopping: " + ", ".join(STOP_ORDER) + ", each after the one before has drained…", flush=True)
        return EXIT_OK
    finally:
        await asyncio.to_thread(stack.stop)
