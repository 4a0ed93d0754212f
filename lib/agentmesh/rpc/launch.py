"""Start a service by name: the one code path `serve`, `up`, the demo and the tests share.

Every service package has `server.py` with
`async def build(settings: Settings, telemetry: Telemetry, address: str | None = None) -> ServiceHost`
that wires its core and adapters onto a host without starting it.
"""

from __future__ import annotations

import importlib

from agentmesh.config import SERVICES, Settings
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry import setup_telemetry

__all__ = ["build_service", "start_service"]


async def build_service(name: str, settings: Settings, address: str | None = None) -> ServiceHost:
    if name not in SERVICES:
        raise ValueError(f"unknown service {name!r}; expected one of {', '.join(SERVICES)}")
    module = importlib.import_module(f"agentmesh.{name}.server")
    telemetry = setup_telemetry(name, settings)
    host: ServiceHost = await module.build(settings, telemetry, address=address)
    return host


async def start_service(name: str, settings: Settings, address: str | None = None) -> ServiceHost:
    host = await build_service(name, settings, address)
    return await host.start()
