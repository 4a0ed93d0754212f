"""The shared library and the services' ports declare their public surface.

In the spirit of httpx's test_exported_members.py: each module below lists in `__all__`
exactly what it offers — every name there exists, and every name it defines without a leading
underscore is there. Anything else is an internal and is named `_like_this`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest

import agentmesh
import agentmesh.rpc
import agentmesh.telemetry

# Module-level names that are plumbing by convention, not surface.
CONVENTIONAL = {"log", "T"}

SERVICE_PORTS = [
    "agentmesh.agent.loop.ports",
    "agentmesh.agent.loop.turn",  # the seam capabilities plug into
    "agentmesh.gateway.ports",
    "agentmesh.scheduler.ports",
    "agentmesh.tools.catalog",
    "agentmesh.tools.sandbox.base",
]


def shared_library_modules() -> list[str]:
    names = ["agentmesh.telemetry"]
    for package in (agentmesh, agentmesh.rpc, agentmesh.telemetry):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            # Generated stubs, and the service and CLI packages installed under the same name.
            if info.name.endswith(".v1") or info.ispkg:
                continue
            names.append(info.name)
    return sorted(names)


MODULES = shared_library_modules() + SERVICE_PORTS


def test_the_shared_library_is_found():
    modules = shared_library_modules()
    assert {"agentmesh.config", "agentmesh.errors", "agentmesh.rpc.peers", "agentmesh.telemetry.genai"} <= set(modules)


def defined_names(module) -> set[str]:
    """Public names the module's own source binds at top level (imports excluded)."""
    tree = ast.parse(inspect.getsource(module))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")} - CONVENTIONAL


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_its_public_surface(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    missing = [member for member in exported if not hasattr(module, member)]
    assert not missing, f"{name}.__all__ names what the module does not have: {missing}"
    undeclared = sorted(defined_names(module) - set(exported))
    assert not undeclared, f"{name} defines public names outside __all__ (export them or make them _private): {undeclared}"
