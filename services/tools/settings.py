"""Tools-service knobs, from AGENTMESH_TOOLS_* and AGENTMESH_SANDBOX_* (see docs/tools.md)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from agentmesh.config import ConfigError, EnvSection, Settings, env, load, referenced_environment, section
from agentmesh.tools.quota import WorkspaceQuota
from agentmesh.tools.sandbox.templates import DEFAULT_TEMPLATE, SandboxTemplate, TemplateSet, load_templates_file

MIB = 1024 * 1024
# MCP server entries may refer to variables of this family (secrets from a Kubernetes Secret).
SECRET_PREFIX = "AGENTMESH_MCP_SECRET_"


def parse_egress_allow(raw: str) -> tuple[str, ...]:
    allowed = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            network = ipaddress.IPv4Network(item, strict=False)
        except ValueError:
            raise ValueError(f"{item!r} is not an IPv4 address or block such as 10.1.2.3 or 10.20.0.0/16") from None
        if network.is_loopback:
            raise ValueError(f"{item!r} is loopback: an egress sandbox's loopback is its own, never the host's")
        allowed.append(str(network))
    return tuple(allowed)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits every executor enforces (the jail through rlimits, a pod through resources)."""

    default_timeout_s: float = env("AGENTMESH_TOOLS_DEFAULT_TIMEOUT_S", 30.0, minimum=0.1)
    max_timeout_s: float = env("AGENTMESH_TOOLS_MAX_TIMEOUT_S", 600.0, minimum=0.1)
    # What the model sees of stdout and stderr, each; the rest is cut with a visible marker.
    output_cap_bytes: int = env("AGENTMESH_TOOLS_OUTPUT_CAP_BYTES", 64 * 1024, minimum=256)
    # Output read (and thrown away) past the cap before the call is stopped; bounds the work a
    # `yes`-style program can make us do without killing commands that are merely chatty.
    output_drain_bytes: int = env("AGENTMESH_TOOLS_OUTPUT_DRAIN_BYTES", 32 * MIB, minimum=1024)
    cpu_s: int = env("AGENTMESH_SANDBOX_CPU_S", 120, minimum=1)
    memory_bytes: int = env("AGENTMESH_SANDBOX_MEMORY_BYTES", 1024 * MIB, minimum=16 * MIB)
    processes: int = env("AGENTMESH_SANDBOX_PROCESSES", 128, minimum=4)
    file_size_bytes: int = env("AGENTMESH_SANDBOX_FILE_SIZE_BYTES", 256 * MIB, minimum=MIB)
    # The local jail's in-memory file systems (/tmp, /dev/shm): each bounded, and what they
    # hold counts against memory_bytes.
    tmp_bytes: int = env("AGENTMESH_SANDBOX_TMP_BYTES", 256 * MIB, minimum=MIB)
    shm_bytes: int = env("AGENTMESH_SANDBOX_SHM_BYTES", 64 * MIB, minimum=MIB)


@dataclass(frozen=True)
class KubernetesSandbox:
    namespace: str = env("AGENTMESH_SANDBOX_NAMESPACE", "agentmesh-sandbox")
    image: str = env("AGENTMESH_SANDBOX_IMAGE", "python:3.12-slim")
    runtime_class: str = env("AGENTMESH_SANDBOX_RUNTIME_CLASS", "")
    workspace_pvc: str = env("AGENTMESH_SANDBOX_WORKSPACE_PVC", "")
    # Job objects linger this long after finishing when our own delete failed.
    ttl_after_finished_s: int = env("AGENTMESH_SANDBOX_TTL_S", 300, minimum=0)
    cpu_request: str = env("AGENTMESH_SANDBOX_CPU_REQUEST", "100m")
    cpu_limit: str = env("AGENTMESH_SANDBOX_CPU_LIMIT", "1")
    # Requested and limited alike: the pod is OOM-killed at this size, never evicted for it.
    memory_limit: str = env("AGENTMESH_SANDBOX_MEMORY_LIMIT", "1Gi")
    tmp_size: str = env("AGENTMESH_SANDBOX_TMP_SIZE", "256Mi")
    # A stdio MCP server's pod lives long and idles most of the time: it reserves less than a call's.
    mcp_cpu_limit: str = env("AGENTMESH_SANDBOX_MCP_CPU_LIMIT", "500m")
    mcp_memory_limit: str = env("AGENTMESH_SANDBOX_MCP_MEMORY_LIMIT", "256Mi")
    kubeconfig: str = env("KUBECONFIG", "")
    context: str = env("AGENTMESH_SANDBOX_KUBE_CONTEXT", "")
    # Retries of API calls that failed on the way (connection errors, 429, 5xx).
    api_retries: int = env("AGENTMESH_SANDBOX_API_RETRIES", 4, minimum=0)
    # uid/gid sandbox pods run as; 0 = the tools service's own (so both can write the shared
    # workspace), or 65534 when the service runs as root. Never root.
    pod_uid: int = env("AGENTMESH_SANDBOX_POD_UID", 0, minimum=0)
    pod_gid: int = env("AGENTMESH_SANDBOX_POD_GID", 0, minimum=0)
    # A pod that cannot be scheduled or pull its image within this long is reported as such.
    start_timeout_s: float = env("AGENTMESH_SANDBOX_START_TIMEOUT_S", 120.0, minimum=1)
    # Session sandboxes' warm pool (sandbox/k8s_pool.py): pods kept started per template, by recent
    # demand between the floor and the ceiling; none after `idle_s` without a claim. Ceiling 0: no pool.
    warm_pool_min: int = env("AGENTMESH_SANDBOX_WARM_POOL_MIN", 0, minimum=0)
    warm_pool_max: int = env("AGENTMESH_SANDBOX_WARM_POOL_MAX", 0, minimum=0)
    warm_pool_idle_s: float = env("AGENTMESH_SANDBOX_WARM_POOL_IDLE_S", 900.0, minimum=1)
    # Where the cluster runs agent-sandbox: the SandboxWarmPool the default template's session
    # sandboxes are claimed from (sandbox/agent_sandbox.py) instead of pods and a warm pool of our
    # own ("" = ours; a template's `agent_sandbox_pool` sets its own).
    agent_sandbox_pool: str = env("AGENTMESH_SANDBOX_AGENT_SANDBOX_POOL", "")


@dataclass(frozen=True)
class WebFetchSettings:
    timeout_s: float = env("AGENTMESH_TOOLS_WEB_TIMEOUT_S", 20.0, minimum=0.1)
    max_bytes: int = env("AGENTMESH_TOOLS_WEB_MAX_BYTES", 2 * MIB, minimum=1024)
    max_redirects: int = 5
    # Loopback, link-local and private targets are refused unless this is set (tests, intranets).
    allow_private: bool = env("AGENTMESH_TOOLS_WEB_ALLOW_PRIVATE", False)
    # Non-public endpoints allowed anyway: "10.1.2.3:8080" (that port) or "10.0.0.0/8" (any port).
    allowed_endpoints: tuple[str, ...] = env("AGENTMESH_TOOLS_WEB_ALLOW", ())
    max_output_chars: int = 50_000


@dataclass(frozen=True)
class McpSettings:
    # Path of a JSON file in the shared {"mcpServers": {...}} shape; "" = no MCP servers.
    servers_file: str = env("AGENTMESH_MCP_SERVERS", "")
    # A server with no call for this long is stopped (a stdio server's process ends); the next call starts it.
    idle_s: float = env("AGENTMESH_MCP_IDLE_S", 300.0, minimum=1)
    connect_timeout_s: float = env("AGENTMESH_MCP_CONNECT_TIMEOUT_S", 20.0, minimum=0.5)
    # `npx`/`uvx` entries: the sandbox template whose network (`egress`) fetches their package once
    # ("" = the first template with `network: egress`), and how long that fetch may take (mcp/fetch.py).
    fetch_template: str = env("AGENTMESH_MCP_FETCH_TEMPLATE", "")
    fetch_timeout_s: float = env("AGENTMESH_MCP_FETCH_TIMEOUT_S", 300.0, minimum=1)
    # One package cache (the deployment's servers', or a namespace's): an install that takes it
    # past the quota is stopped and undone; after each install, and at start, the least recently
    # used packages no running server uses are removed until it holds no more than the ceiling.
    package_cache_quota_bytes: int = env("AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB", 8192 * MIB, minimum=1, unit=MIB)
    package_cache_max_bytes: int = env("AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB", 2048 * MIB, minimum=0, unit=MIB)
    ping_interval_s: float = env("AGENTMESH_MCP_PING_INTERVAL_S", 5.0, minimum=0.1)
    backoff_max_s: float = env("AGENTMESH_MCP_BACKOFF_MAX_S", 60.0, minimum=0.1)
    # Images and audio one call may attach, all together.
    attachment_cap_bytes: int = env("AGENTMESH_MCP_ATTACHMENT_CAP_BYTES", 1 * MIB, minimum=0)
    # The values of the entries' `${AGENTMESH_MCP_SECRET_...}` references (and no other variable).
    secrets: Mapping[str, str] = referenced_environment(SECRET_PREFIX)
    # Mounted secrets ({"secretRef": NAME}): the deployment's are its files, a namespace's the
    # files of its subdirectory <namespace>/ (mcp/secrets.py); "" = none mounted.
    secrets_dir: str = env("AGENTMESH_MCP_SECRETS_DIR", "")

    def __post_init__(self) -> None:
        if self.package_cache_max_bytes >= self.package_cache_quota_bytes:
            raise ConfigError(
                f"AGENTMESH_MCP_PACKAGE_CACHE_MAX_MB ({self.package_cache_max_bytes // MIB}) must be less than "
                f"AGENTMESH_MCP_PACKAGE_CACHE_QUOTA_MB ({self.package_cache_quota_bytes // MIB}): the cache is pruned "
                "to the first, and an install may grow it up to the second")

    @property
    def package_cache_quota(self) -> WorkspaceQuota:
        """What one package cache may hold while a package is installed into it (the fetch jail's watch)."""
        return WorkspaceQuota(self.package_cache_quota_bytes)


@dataclass(frozen=True)
class ToolsSettings(EnvSection):
    workspace_root: Path = Path("workspaces")  # placed under AGENTMESH_HOME by from_settings
    mode: str = "local"
    limits: SandboxLimits = section(SandboxLimits)
    kubernetes: KubernetesSandbox = section(KubernetesSandbox)
    web: WebFetchSettings = section(WebFetchSettings)
    mcp: McpSettings = section(McpSettings)
    bwrap_path: str = env("AGENTMESH_SANDBOX_BWRAP", "/usr/bin/bwrap")
    # Loudly named on purpose: command tools run as plain child processes, unconfined.
    unsafe_no_isolation: bool = env("AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION", False)
    # A seccomp filter in the local jail (see sandbox/seccomp.py); off only to debug a program it stops.
    seccomp: bool = env("AGENTMESH_SANDBOX_SECCOMP", True)
    # "call": every command in a fresh jail (the default); "session": one long-lived jail per
    # session, each call a fresh process in it, `python` a persistent interpreter (sandbox/session.py);
    # with AGENTMESH_SANDBOX=kubernetes one pod per session, calls through pods/exec (sandbox/k8s_session.py).
    isolation: str = env("AGENTMESH_SANDBOX_ISOLATION", "call", choices=("call", "session"))
    # Named sandbox templates (sandbox/templates.py): a YAML or JSON file; "" = only `default`,
    # today's sandbox from the settings above and below.
    templates_file: tuple[tuple[str, dict[str, str]], ...] = env("AGENTMESH_SANDBOX_TEMPLATES", (),
                                                                 parse=load_templates_file)
    # A session sandbox with no call for this long is ended; the next call starts a new one on the same workspace.
    session_idle_s: float = env("AGENTMESH_SANDBOX_SESSION_IDLE_S", 600.0, minimum=0.1)
    # Per-call network for command tools (the jail has none by default).
    command_network: bool = env("AGENTMESH_SANDBOX_NETWORK", False)
    # Set by for_template for a `network: egress` template's executor (a session jail's network).
    egress: bool = False
    template_name: str = DEFAULT_TEMPLATE  # the template these settings are for (for_template)
    # IPv4 blocks an egress template's jail may reach although they are not public ("10.1.2.3",
    # "10.20.0.0/16": a package mirror or proxy); loopback stays the jail's own.
    egress_allow: tuple[str, ...] = env("AGENTMESH_SANDBOX_EGRESS_ALLOW", (), parse=parse_egress_allow)
    # When the service runs as root, the host uid/gid jailed programs run as (outside their user
    # namespace). Root's own uid would exempt them from the process-count limit and let them read
    # root-only files that are visible in the jail.
    host_uid: int = env("AGENTMESH_SANDBOX_HOST_UID", 65534, minimum=1)
    host_gid: int = env("AGENTMESH_SANDBOX_HOST_GID", 65534, minimum=1)
    max_arguments_bytes: int = 1 * MIB
    # Sandboxes running at once in this replica; further calls wait their turn (inside their timeout budget).
    max_concurrent_sandboxes: int = env("AGENTMESH_SANDBOX_MAX_CONCURRENT", 32, minimum=1)
    max_file_read_bytes: int = 256 * 1024
    # Background commands (background.py): running at once per session, and the longest any may live.
    background_per_session: int = env("AGENTMESH_TOOLS_BACKGROUND_PER_SESSION", 4, minimum=0)
    background_max_s: float = env("AGENTMESH_TOOLS_BACKGROUND_MAX_S", 1800.0, minimum=1)
    # Disk one session's workspace may hold: commands (jail or pod) and file tools alike.
    workspace_quota_bytes: int = env("AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB", 1024 * MIB, minimum=1, unit=MIB)
    # Files (inodes) it may hold: empty files cost the host an inode each and every measure of
    # the workspace a look, while taking next to no bytes.
    workspace_quota_files: int = env("AGENTMESH_TOOLS_WORKSPACE_QUOTA_FILES", 100_000, minimum=1)
    # The workspace as people see it (web console): how much of one file a view returns, and the
    # largest file an upload may write (within the quota too).
    max_view_bytes: int = env("AGENTMESH_TOOLS_MAX_VIEW_BYTES", 1 * MIB, minimum=1024)
    max_upload_bytes: int = env("AGENTMESH_TOOLS_MAX_UPLOAD_BYTES", 2 * MIB, minimum=1024)
    # The largest image kept under a workspace's .attachments/ (a user's, stored by the agent, or
    # one a tool returned: read_file of an image, an MCP tool's image content); docs/agent.md "Images".
    max_image_bytes: int = env("AGENTMESH_TOOLS_MAX_IMAGE_BYTES", 5 * MIB, minimum=1024, maximum=12 * MIB)
    # Figures one `python` cell of a session sandbox hands back as images (the first ones drawn;
    # the rest are named in its text only): every image is sent with each later model call.
    max_cell_images: int = env("AGENTMESH_TOOLS_MAX_CELL_IMAGES", 4, minimum=0, maximum=20)

    @cached_property
    def workspace_quota(self) -> WorkspaceQuota:
        """The session workspace quota every executor, the file tools and uploads hold to: built
        here once, from workspace_quota_bytes and workspace_quota_files, so no part can hold to another figure."""
        return WorkspaceQuota(self.workspace_quota_bytes, self.workspace_quota_files)

    @cached_property
    def templates(self) -> TemplateSet:
        """The deployment's sandbox templates: `default` is the sandbox the settings describe."""
        pod = self.kubernetes
        memory = pod.memory_limit if self.mode == "kubernetes" else f"{self.limits.memory_bytes // MIB}Mi"
        default = SandboxTemplate(
            DEFAULT_TEMPLATE, image=pod.image, cpu=pod.cpu_limit, memory=memory,
            disk_quota=f"{self.workspace_quota_bytes // MIB}Mi", runtime_class=pod.runtime_class,
            network="none", isolation=self.isolation, description="the deployment's sandbox",
            agent_sandbox_pool=pod.agent_sandbox_pool,
        )
        return TemplateSet(default, self.templates_file)

    def for_template(self, template: SandboxTemplate) -> ToolsSettings:
        """These settings with `template`'s sizes, image and runtime class: what an executor of
        that template is built from."""
        memory = template.memory_bytes
        pod = replace(self.kubernetes, image=template.image, cpu_limit=template.cpu,
                      runtime_class=template.runtime_class, agent_sandbox_pool=template.agent_sandbox_pool,
                      memory_limit=template.memory if self.mode == "kubernetes" else f"{memory // MIB}Mi")
        return replace(self, limits=replace(self.limits, memory_bytes=memory), kubernetes=pod,
                       workspace_quota_bytes=template.disk_quota_bytes, isolation=template.isolation,
                       egress=template.egress, template_name=template.name)

    @classmethod
    def from_settings(cls, settings: Settings) -> ToolsSettings:
        """The tools section of the loaded tree, placed under the data directory."""
        return replace(settings.section(cls), workspace_root=settings.home / "workspaces", mode=settings.sandbox)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, home: Path | None = None, mode: str = "local") -> ToolsSettings:
        """Only the tools section, from `environ` (benches and tests); `home` places the workspaces."""
        loaded = load(cls, environ)
        return replace(loaded, workspace_root=Path(home) / "workspaces" if home else loaded.workspace_root, mode=mode)
