"""The tools core: catalog, argument checks, dispatch to a tool, workspaces. Knows nothing of gRPC.

Model-made mistakes (unknown tool, bad arguments, a path outside the workspace) come back as
results with `is_error` so the model can read them and correct itself; only a malformed request
(bad session id, oversized arguments, a nonsensical timeout) raises InvalidArgument.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Callable, Iterable, Protocol, cast

import structlog

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.logs import get_logger
from agentmesh.tools.background import BackgroundCommand, BackgroundCommands
from agentmesh.tools.background_sessions import BackgroundSessions
from agentmesh.tools.catalog import CallContext, ChangingProvider, Tool, ToolProvider, ToolSpec
from agentmesh.tools.catalog_version import CatalogVersions
from agentmesh.tools.images import store_images
from agentmesh.tools.results import ToolFailure, ToolOutcome
from agentmesh.tools.sandbox.per_template import TemplateSandboxes, unknown_template
from agentmesh.tools.sandbox.templates import TemplateSet
from agentmesh.tools.workspace import Workspaces

log = get_logger("agentmesh.tools")

MAX_NAME_CHARS = 128
MAX_CALL_ID_CHARS = 256


class NamespaceTools(Protocol):
    """Tools a namespace has of its own (its MCP servers), beside everyone's. `version`: the
    namespace's mcp_servers_version as the caller knows it (None: unknown, read it)."""

    # Called whenever some namespace's tools change (set by ToolService).
    on_change: Callable[[], None]

    async def tools(self, namespace: str, version: float | None = None) -> list[Tool]: ...
    async def unavailable(self, namespace: str, version: float | None = None) -> dict[str, str]: ...
    async def find(self, namespace: str, name: str, version: float | None = None) -> Tool | None: ...


class SessionEnder(Protocol):
    """Ends a session's long-lived sandbox (sandbox/session.py) when its workspace is deleted."""

    async def end_session(self, session_id: str) -> None: ...


class ToolService:
    def __init__(self, providers: Iterable[ToolProvider], workspaces: Workspaces, max_arguments_bytes: int,
                 background: BackgroundCommands | None = None, namespaces: NamespaceTools | None = None,
                 max_image_bytes: int = 5 * 1024 * 1024):
        self.background = background
        # The largest image a call may hand back (images.py); a larger one is described instead.
        self.max_image_bytes = max_image_bytes
        # With AGENTMESH_SANDBOX_ISOLATION=session: the sessions' long-lived jails, ended with their workspace.
        self.session_sandboxes: SessionEnder | None = None
        # The deployment's sandbox templates: a call naming another is refused (None: not checked).
        self.templates: TemplateSet | None = None
        # Their executors (sandbox/per_template.py), closed with the service; None: only the default one.
        self.sandboxes: TemplateSandboxes | None = None
        # The sessions with background state, streamed by WatchBackground (none without background commands).
        self.background_sessions = background.sessions if background is not None else BackgroundSessions()
        # Changes with every change of any catalog (WatchCatalog), so callers can keep listings.
        self.versions = CatalogVersions()
        self._namespaces: NamespaceTools | None = None
        self.namespaces = namespaces
        self._tools: dict[str, Tool] = {}
        # Providers whose catalog changes while the service runs (MCP servers): asked on each look.
        self._dynamic: list[ChangingProvider] = []
        for provider in providers:
            if getattr(provider, "dynamic", False):
                changing = cast(ChangingProvider, provider)
                changing.on_change = self.versions.changed
                self._dynamic.append(changing)
                continue
            for tool in provider.tools():
                self._tools[tool.spec.name] = tool
        self._workspaces = workspaces
        self._max_arguments_bytes = max_arguments_bytes

    @property
    def namespaces(self) -> NamespaceTools | None:
        return self._namespaces

    @namespaces.setter
    def namespaces(self, namespaces: NamespaceTools | None) -> None:
        self._namespaces = namespaces
        if namespaces is not None:
            namespaces.on_change = self.versions.changed

    def specs(self) -> list[ToolSpec]:
        specs = [tool.spec for tool in self._tools.values()]
        for provider in self._dynamic:
            specs += [tool.spec for tool in provider.tools() if tool.spec.name not in self._tools]
        return specs

    async def catalog(self, namespace: str = "", mcp_version: float | None = None) -> list[ToolSpec]:
        """Everyone's tools, and the namespace's own (which cannot shadow them)."""
        specs = self.specs()
        if namespace and self.namespaces is not None:
            validate_namespace(namespace)
            taken = {spec.name for spec in specs}
            specs += [tool.spec for tool in await self.namespaces.tools(namespace, mcp_version) if tool.spec.name not in taken]
        return specs

    async def versioned_catalog(self, namespace: str = "", mcp_version: float | None = None) -> tuple[list[ToolSpec], str]:
        """The catalog and its version, read before the listing: a change during it makes the
        version stale, never the listing older than its version."""
        version = self.versions.current
        return await self.catalog(namespace, mcp_version), version

    async def unavailable_servers(self, namespace: str = "", mcp_version: float | None = None) -> dict[str, str]:
        """The MCP servers not running now (their tools are missing from the catalog) and why:
        the deployment's, and the namespace's own."""
        down: dict[str, str] = {}
        for provider in self._dynamic:
            status = getattr(provider, "status", None)  # MCP servers; A2A agents have none
            if status is not None:
                down.update({name: s["error"] for name, s in status().items() if not s["available"] and s["error"]})
        if namespace and self.namespaces is not None:
            down.update(await self.namespaces.unavailable(namespace, mcp_version))
        return down

    def _find(self, name: str) -> Tool | None:
        tool = self._tools.get(name)
        for provider in self._dynamic:
            if tool is not None:
                break
            tool = provider.find(name)
        return tool

    async def execute(
        self, session_id: str, call_id: str, name: str, arguments_json: str, timeout_s: float = 0.0,
        namespace: str = "", mcp_version: float | None = None, sandbox_template: str = "", isolation: str = "",
        tenant: str = "",
    ) -> ToolOutcome:
        validate_id(session_id, "session_id")
        if sandbox_template and self.templates is not None and self.templates.get(sandbox_template) is None:
            raise unknown_template(self.templates, sandbox_template)
        if isolation not in ("", "call", "session"):
            raise InvalidArgument(f"isolation must be call or session (or empty: the template's), got {isolation[:40]!r}",
                                  field="isolation")
        if namespace:
            validate_namespace(namespace)
        if len(call_id) > MAX_CALL_ID_CHARS:
            raise InvalidArgument(f"call_id is {len(call_id)} characters long; at most {MAX_CALL_ID_CHARS} are allowed")
        if len(name) > MAX_NAME_CHARS:
            raise InvalidArgument(f"the tool name is {len(name)} characters long; at most {MAX_NAME_CHARS} are allowed")
        size = len(arguments_json.encode("utf-8"))
        if size > self._max_arguments_bytes:
            raise InvalidArgument(f"arguments_json is {size} bytes; at most {self._max_arguments_bytes} are allowed")
        if not math.isfinite(timeout_s) or timeout_s < 0:
            raise InvalidArgument(f"timeout_s must be a non-negative number of seconds (0 = the tool's default), got {timeout_s}")

        started = time.monotonic()
        with structlog.contextvars.bound_contextvars(session_id=session_id, call_id=call_id, tool=name):
            outcome = await self._dispatch(CallContext(session_id, call_id, timeout_s, sandbox_template, isolation, namespace, tenant), name, arguments_json, namespace,
                                           mcp_version)
            if any(image.data for image in outcome.images):
                # Stored once in the workspace; the result carries references, not bytes.
                outcome = await asyncio.to_thread(store_images, self._workspaces, session_id, outcome,
                                                  self.max_image_bytes)
            if not outcome.duration_ms:
                outcome.duration_ms = (time.monotonic() - started) * 1000
            log.info("tool call finished", is_error=outcome.is_error, error_kind=outcome.error_kind, duration_ms=round(outcome.duration_ms, 1))
            return outcome

    async def _dispatch(self, ctx: CallContext, name: str, arguments_json: str, namespace: str = "",
                        mcp_version: float | None = None) -> ToolOutcome:
        tool = self._find(name)
        if tool is None and namespace and self.namespaces is not None:
            tool = await self.namespaces.find(namespace, name, mcp_version)
        if tool is None:
            known = ", ".join(sorted(spec.name for spec in await self.catalog(namespace, mcp_version)))
            return ToolOutcome(output=f"there is no tool named {name!r}; the tools are: {known}", is_error=True, error_kind="unknown_tool")
        try:
            arguments = tool.parse_arguments(arguments_json)
            return await tool.run(ctx, arguments)
        except ToolFailure as failure:
            return failure.outcome()
        except asyncio.CancelledError:
            log.info("tool call cancelled")
            raise
        except OSError as exc:
            # Permission problems, full disks and the like: the model may be able to work around them.
            return ToolOutcome(output=f"{name} failed: {exc.strerror or exc}", is_error=True, error_kind="os_error")

    def background_results(self, session_id: str) -> tuple[list[BackgroundCommand], int]:
        validate_id(session_id, "session_id")
        return self.background.take_finished(session_id) if self.background else ([], 0)

    async def stop_background(self, session_id: str) -> int:
        validate_id(session_id, "session_id")
        return await self.background.stop_session(session_id) if self.background else 0

    async def delete_workspace(self, session_id: str) -> bool:
        validate_id(session_id, "session_id")
        if self.background is not None:  # nothing of the session may outlive it
            await self.background.forget_session(session_id)
        if self.session_sandboxes is not None:  # nor its session sandbox (the jail and its Python state)
            await self.session_sandboxes.end_session(session_id)
        return await asyncio.to_thread(self._workspaces.delete, session_id)
