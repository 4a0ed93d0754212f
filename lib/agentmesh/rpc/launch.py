"""Start a service by name: the one code path `serve`, `up`, the demo and the tests share.

Every service package has a composition root with
`async def build(settings: Settings, telemetry: Telemetry, address: str | None = None) -> ServiceHost`
that wires its core and adapters onto a host without starting it: `wiring.py` where the service
has one (the gateway and memory, whose servicers alone fill their `server.py`), else `server.py`.
"""

from __future__ import annotations

import importlib
import importlib.util

from agentmesh.config import SERVICES, Settings
from agentmesh.rpc.server import ServiceHost
from agentmesh.telemetry import setup_telemetry

__all__ = ["build_service", "start_service"]


async def build_service(name: str, settings: Settings, address: str | None = None) -> ServiceHost:
    if name not in SERVICES:
        raise ValueError(f"unknown service {name!r}; expected one of {', '.join(SERVICES)}")
    module = importlib.import_module(_composition_root(name))
    telemetry = setup_telemetry(name, settings)
    host: ServiceHost = await module.build(settings, telemetry, address=address)
    return host


async def start_service(name: str, settings: Settings, address: str | None = None) -> ServiceHost:
    host = await build_service(name, settings, address)
    return await host.start()


def _composition_root(name: str) -> str:
    wiring = f"agentmesh.{name}.wiring"
    return wiring if importlib.util.find_spec(wiring) is not None else f"agentmesh.{name}.server"
