"""Building the MCP provider from settings: parse the servers file, choose how each server is
reached, check what can be checked before the service starts serving."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from opentelemetry import trace

from agentmesh.config import ConfigError
from agentmesh.tools.mcp.a2a_agents import A2aAgentTools, SessionDepth
from agentmesh.tools.mcp.config import McpServerEntry, load_agents, load_servers
from agentmesh.tools.mcp.connection import McpServerConnection, SupervisorTimings
from agentmesh.tools.mcp.fetch import PackageFetcher
from agentmesh.tools.mcp.openers import JailedStdioOpener, http_opener, server_workdir
from agentmesh.tools.mcp.package_cache import cache_dirs, prune_cache
from agentmesh.tools.mcp.pod_servers import PodServers, owner_name
from agentmesh.tools.mcp.secrets import SecretSource
from agentmesh.tools.mcp.tools import McpTools
from agentmesh.tools.sandbox.base import Executor
from agentmesh.tools.sandbox.k8s_session import KubernetesSessionPods
from agentmesh.tools.sandbox.kubernetes import KubernetesExecutor
from agentmesh.tools.sandbox.local import LocalJail
from agentmesh.tools.sandbox.seccomp import compile_filter
from agentmesh.tools.settings import ToolsSettings
from agentmesh.tools.web_tools import AddressPolicy


class ConnectionFactory:
    """A supervised connection for a server entry: HTTP through the egress policy, stdio in the
    local jail (its /workspace a directory of its own under `root`) or, with the Kubernetes
    executor, as a pod of its own reached through `pods/attach` (pod_opener.py)."""

    def __init__(self, settings: ToolsSettings, executor: Executor, owner: tuple[int, int] | None):
        self._settings = settings
        self._executor = executor
        self._owner = owner
        self.timings = SupervisorTimings(
            connect_timeout_s=settings.mcp.connect_timeout_s, idle_s=settings.mcp.idle_s,
            ping_interval_s=settings.mcp.ping_interval_s, backoff_max_s=settings.mcp.backoff_max_s)
        self.policy = AddressPolicy.parse(settings.web.allow_private, settings.web.allowed_endpoints)
        self.root = settings.workspace_root.parent / "mcp"
        self._seccomp_file: Path | None = None
        self._fetcher: PackageFetcher | None = None
        self.pods: PodServers | None = None
        if isinstance(executor, (KubernetesExecutor, KubernetesSessionPods)):
            self.pods = PodServers(executor.api, settings.kubernetes, executor.identity, self.timings,
                                   owner=owner_name(self.root))

    @property
    def sandbox(self) -> str:
        """Where stdio servers run, as server entries are checked for it (config.parse_entry)."""
        return "kubernetes" if self.pods is not None else "local"

    @property
    def runs_stdio(self) -> bool:
        return self.pods is not None or (isinstance(self._executor, LocalJail) and self._executor.available)

    async def start(self) -> None:
        """Before any server starts: remove the server pods an earlier run of this service left,
        and prune the package caches to their ceiling (nothing is in use yet)."""
        if self.pods is not None:
            await self.pods.sweep()
        for cache in cache_dirs(self.root):
            await prune_cache(cache, self._settings.mcp.package_cache_max_bytes)

    def check_started(self) -> None:
        """After the deployment's servers first started: one that cannot run at all (its image, its
        command, the service's permissions) stops the service, as a command not found does locally."""
        problems = self.pods.configuration_problems() if self.pods is not None else []
        if problems:
            raise ConfigError("; ".join(problems))

    def __call__(self, entry: McpServerEntry, root: Path | None = None, namespace: str = "") -> McpServerConnection:
        if entry.transport == "http":
            return McpServerConnection(entry.name, http_opener(entry, self.policy, self._settings.mcp.connect_timeout_s),
                                       self.timings)
        if not self.runs_stdio:
            raise ConfigError(
                f"MCP server {entry.name!r} is a stdio server, and stdio servers run only in the local jail "
                "(AGENTMESH_SANDBOX=local with bubblewrap installed) or as pods (AGENTMESH_SANDBOX=kubernetes); "
                "run it as a streamable-HTTP server instead"
            )
        root = root or self.root
        if self.pods is not None:
            root.mkdir(parents=True, exist_ok=True)
            errlog = open(root / f"{entry.name}.stderr.log", "a", encoding="utf-8")  # noqa: SIM115 - lives with the connection
            return self.pods.connection(entry, errlog, namespace)
        workdir = server_workdir(root, entry.name, self._owner)
        if self._settings.seccomp and self._seccomp_file is None:
            program = compile_filter()  # None: libseccomp missing, warned about by the jail too
            if program is not None:
                self.root.mkdir(parents=True, exist_ok=True)
                self._seccomp_file = self.root / "seccomp.bpf"
                self._seccomp_file.write_bytes(program)
                self._seccomp_file.chmod(0o644)
        errlog = open(root / f"{entry.name}.stderr.log", "a", encoding="utf-8")  # noqa: SIM115 - lives with the connection
        assert isinstance(self._executor, LocalJail)
        # The deployment's servers (the operator's file) get what their command needs bound in
        # (server_paths.py); a namespace's admin names only its command, not host directories.
        # npx/uvx entries: their package is installed into the cache of the deployment's servers or
        # of the namespace's own (root), never shared across namespaces.
        packages = (self.fetcher(), root / "packages") if entry.package is not None else None
        opener = JailedStdioOpener(entry, self._executor, workdir, errlog, self._seccomp_file, find_binds=not namespace,
                                   packages=packages)
        return McpServerConnection(entry.name, opener, self.timings, last_words=opener.last_words)

    def fetcher(self) -> PackageFetcher:
        """What installs npx/uvx entries' packages: a jail of the fetch template (the one
        AGENTMESH_MCP_FETCH_TEMPLATE names, else the first with `network: egress`), built once."""
        if self._fetcher is None:
            templates = self._settings.templates
            chosen = self._settings.mcp.fetch_template
            template = templates.get(chosen) if chosen else next((t for t in templates.all() if t.egress), None)
            if chosen and (template is None or not template.egress):
                raise ConfigError(f"AGENTMESH_MCP_FETCH_TEMPLATE={chosen}: " + (
                    templates.unknown_detail(chosen) if template is None else
                    f"template {chosen!r} has no egress (network: {template.network}); npx/uvx packages are fetched "
                    "through a template with `network: egress`"))
            jail = self._executor if isinstance(self._executor, LocalJail) else None
            if jail is not None and template is not None:
                # The template's sizes (Node wants more address space than the default's 1 GiB).
                jail = LocalJail(self._settings.for_template(template), jail.workspaces, jail.tracer)
            mcp = self._settings.mcp
            self._fetcher = PackageFetcher(jail, template, mcp.fetch_timeout_s, self._owner, mcp.package_cache_quota,
                                           mcp.package_cache_max_bytes)
        return self._fetcher


def secret_source(settings: ToolsSettings) -> SecretSource:
    """The deployment's secrets: the mounted files of AGENTMESH_MCP_SECRETS_DIR and the
    AGENTMESH_MCP_SECRET_* variables (namespaces get `.for_namespace(...)` of it)."""
    return SecretSource(settings.mcp.secrets_dir, settings.mcp.secrets)


def build_mcp_tools(settings: ToolsSettings, connections: ConnectionFactory,
                    tracer: trace.Tracer | None = None) -> McpTools | None:
    entries = load_servers(settings.mcp.servers_file, secret_source(settings), connections.sandbox)
    if not entries:
        return None
    return McpTools([connections(entry) for entry in entries], settings.limits, settings.mcp.attachment_cap_bytes,
                    tracer)


async def start_mcp_tools(mcp_tools: McpTools, connections: ConnectionFactory) -> None:
    """Start the deployment's servers; ConfigError when one cannot run at all."""
    try:
        await mcp_tools.start()
        connections.check_started()
    except BaseException:
        await mcp_tools.close()
        raise


def build_a2a_tools(settings: ToolsSettings, open_session_depth: Callable[[], SessionDepth]) -> A2aAgentTools | None:
    """The remote A2A agents of the servers file ("a2aAgents"), reached through web_fetch's egress
    policy; None when there are none. `open_session_depth` is called only when there are."""
    sandbox = "kubernetes" if settings.mode == "kubernetes" else "local"
    entries = load_agents(settings.mcp.servers_file, secret_source(settings), sandbox)
    if not entries:
        return None
    policy = AddressPolicy.parse(settings.web.allow_private, settings.web.allowed_endpoints)
    return A2aAgentTools(entries, policy, settings.limits, open_session_depth(), settings.mcp.connect_timeout_s)
