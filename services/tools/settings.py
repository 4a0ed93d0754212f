"""Tools-service knobs, from AGENTMESH_TOOLS_* and AGENTMESH_SANDBOX_* (see docs/tools.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from agentmesh.config import Settings, env_bool, env_float, env_int, env_str

MIB = 1024 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits every executor enforces (the jail through rlimits, a pod through resources)."""

    default_timeout_s: float = 30.0
    max_timeout_s: float = 600.0
    # What the model sees of stdout and stderr, each; the rest is cut with a visible marker.
    output_cap_bytes: int = 64 * 1024
    # Output read (and thrown away) past the cap before the call is stopped; bounds the work a
    # `yes`-style program can make us do without killing commands that are merely chatty.
    output_drain_bytes: int = 32 * MIB
    cpu_s: int = 120
    memory_bytes: int = 1024 * MIB
    processes: int = 128
    file_size_bytes: int = 256 * MIB


@dataclass(frozen=True)
class KubernetesSandbox:
    namespace: str = "agentmesh-sandbox"
    image: str = "python:3.12-slim"
    runtime_class: str = ""
    workspace_pvc: str = ""
    # Job objects linger this long after finishing when our own delete failed.
    ttl_after_finished_s: int = 300
    cpu_request: str = "100m"
    cpu_limit: str = "1"
    # Requested and limited alike: the pod is OOM-killed at this size, never evicted for it.
    memory_limit: str = "1Gi"
    tmp_size: str = "256Mi"
    kubeconfig: str = ""
    context: str = ""
    # Retries of API calls that failed on the way (connection errors, 429, 5xx).
    api_retries: int = 4
    # uid/gid sandbox pods run as; 0 = the tools service's own (so both can write the shared
    # workspace), or 65534 when the service runs as root. Never root.
    pod_uid: int = 0
    pod_gid: int = 0
    # A pod that cannot be scheduled or pull its image within this long is reported as such.
    start_timeout_s: float = 120.0


@dataclass(frozen=True)
class WebFetchSettings:
    timeout_s: float = 20.0
    max_bytes: int = 2 * MIB
    max_redirects: int = 5
    # Loopback, link-local and private targets are refused unless this is set (tests, intranets).
    allow_private: bool = False
    # Non-public endpoints allowed anyway: "10.1.2.3:8080" (that port) or "10.0.0.0/8" (any port).
    allowed_endpoints: tuple[str, ...] = ()
    max_output_chars: int = 50_000


@dataclass(frozen=True)
class ToolsSettings:
    workspace_root: Path
    mode: str = "local"
    limits: SandboxLimits = SandboxLimits()
    kubernetes: KubernetesSandbox = KubernetesSandbox()
    web: WebFetchSettings = WebFetchSettings()
    bwrap_path: str = "/usr/bin/bwrap"
    # Loudly named on purpose: command tools run as plain child processes, unconfined.
    unsafe_no_isolation: bool = False
    # A seccomp filter in the local jail (see sandbox/seccomp.py); off only to debug a program it stops.
    seccomp: bool = True
    # Per-call network for command tools (the jail has none by default).
    command_network: bool = False
    # When the service runs as root, the host uid/gid jailed programs run as (outside their user
    # namespace). Root's own uid would exempt them from the process-count limit and let them read
    # root-only files that are visible in the jail.
    host_uid: int = 65534
    host_gid: int = 65534
    max_arguments_bytes: int = 1 * MIB
    # Sandboxes running at once in this replica; further calls wait their turn (inside their timeout budget).
    max_concurrent_sandboxes: int = 32
    max_file_read_bytes: int = 256 * 1024
    # Background commands (background.py): running at once per session, and the longest any may live.
    background_per_session: int = 4
    background_max_s: float = 1800.0
    # Disk one session's workspace may hold: commands (jail or pod) and file tools alike.
    workspace_quota_bytes: int = 1024 * MIB
    # The workspace as people see it (web console): how much of one file a view returns, and the
    # largest file an upload may write (within the quota too).
    max_view_bytes: int = 1 * MIB
    max_upload_bytes: int = 2 * MIB

    @classmethod
    def from_settings(cls, settings: Settings) -> "ToolsSettings":
        return cls.from_env(settings.environ, home=settings.home, mode=settings.sandbox)

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, home: Path, mode: str = "local") -> "ToolsSettings":
        limits = SandboxLimits(
            default_timeout_s=env_float(env, "AGENTMESH_TOOLS_DEFAULT_TIMEOUT_S", SandboxLimits.default_timeout_s, minimum=0.1),
            max_timeout_s=env_float(env, "AGENTMESH_TOOLS_MAX_TIMEOUT_S", SandboxLimits.max_timeout_s, minimum=0.1),
            output_cap_bytes=env_int(env, "AGENTMESH_TOOLS_OUTPUT_CAP_BYTES", SandboxLimits.output_cap_bytes, minimum=256),
            output_drain_bytes=env_int(env, "AGENTMESH_TOOLS_OUTPUT_DRAIN_BYTES", SandboxLimits.output_drain_bytes, minimum=1024),
            cpu_s=env_int(env, "AGENTMESH_SANDBOX_CPU_S", SandboxLimits.cpu_s, minimum=1),
            memory_bytes=env_int(env, "AGENTMESH_SANDBOX_MEMORY_BYTES", SandboxLimits.memory_bytes, minimum=16 * MIB),
            processes=env_int(env, "AGENTMESH_SANDBOX_PROCESSES", SandboxLimits.processes, minimum=4),
            file_size_bytes=env_int(env, "AGENTMESH_SANDBOX_FILE_SIZE_BYTES", SandboxLimits.file_size_bytes, minimum=MIB),
        )
        kubernetes = KubernetesSandbox(
            namespace=env_str(env, "AGENTMESH_SANDBOX_NAMESPACE", KubernetesSandbox.namespace),
            image=env_str(env, "AGENTMESH_SANDBOX_IMAGE", KubernetesSandbox.image),
            runtime_class=env_str(env, "AGENTMESH_SANDBOX_RUNTIME_CLASS"),
            workspace_pvc=env_str(env, "AGENTMESH_SANDBOX_WORKSPACE_PVC"),
            ttl_after_finished_s=env_int(env, "AGENTMESH_SANDBOX_TTL_S", KubernetesSandbox.ttl_after_finished_s, minimum=0),
            cpu_request=env_str(env, "AGENTMESH_SANDBOX_CPU_REQUEST", KubernetesSandbox.cpu_request),
            cpu_limit=env_str(env, "AGENTMESH_SANDBOX_CPU_LIMIT", KubernetesSandbox.cpu_limit),
            memory_limit=env_str(env, "AGENTMESH_SANDBOX_MEMORY_LIMIT", KubernetesSandbox.memory_limit),
            tmp_size=env_str(env, "AGENTMESH_SANDBOX_TMP_SIZE", KubernetesSandbox.tmp_size),
            kubeconfig=env_str(env, "KUBECONFIG"),
            context=env_str(env, "AGENTMESH_SANDBOX_KUBE_CONTEXT"),
            api_retries=env_int(env, "AGENTMESH_SANDBOX_API_RETRIES", KubernetesSandbox.api_retries, minimum=0),
            pod_uid=env_int(env, "AGENTMESH_SANDBOX_POD_UID", 0, minimum=0),
            pod_gid=env_int(env, "AGENTMESH_SANDBOX_POD_GID", 0, minimum=0),
            start_timeout_s=env_float(env, "AGENTMESH_SANDBOX_START_TIMEOUT_S", KubernetesSandbox.start_timeout_s, minimum=1),
        )
        web = WebFetchSettings(
            timeout_s=env_float(env, "AGENTMESH_TOOLS_WEB_TIMEOUT_S", WebFetchSettings.timeout_s, minimum=0.1),
            max_bytes=env_int(env, "AGENTMESH_TOOLS_WEB_MAX_BYTES", WebFetchSettings.max_bytes, minimum=1024),
            allow_private=env_bool(env, "AGENTMESH_TOOLS_WEB_ALLOW_PRIVATE", False),
            allowed_endpoints=tuple(e.strip() for e in env_str(env, "AGENTMESH_TOOLS_WEB_ALLOW").split(",") if e.strip()),
        )
        return cls(
            workspace_root=Path(home) / "workspaces",
            mode=mode,
            limits=limits,
            kubernetes=kubernetes,
            web=web,
            bwrap_path=env_str(env, "AGENTMESH_SANDBOX_BWRAP", cls.bwrap_path),
            unsafe_no_isolation=env_bool(env, "AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION", False),
            command_network=env_bool(env, "AGENTMESH_SANDBOX_NETWORK", False),
            seccomp=env_bool(env, "AGENTMESH_SANDBOX_SECCOMP", True),
            host_uid=env_int(env, "AGENTMESH_SANDBOX_HOST_UID", cls.host_uid, minimum=1),
            max_concurrent_sandboxes=env_int(env, "AGENTMESH_SANDBOX_MAX_CONCURRENT", cls.max_concurrent_sandboxes, minimum=1),
            host_gid=env_int(env, "AGENTMESH_SANDBOX_HOST_GID", cls.host_gid, minimum=1),
            background_per_session=env_int(env, "AGENTMESH_TOOLS_BACKGROUND_PER_SESSION", cls.background_per_session,
                                           minimum=0),
            background_max_s=env_float(env, "AGENTMESH_TOOLS_BACKGROUND_MAX_S", cls.background_max_s, minimum=1),
            workspace_quota_bytes=env_int(env, "AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB", cls.workspace_quota_bytes // MIB, minimum=1) * MIB,
            max_view_bytes=env_int(env, "AGENTMESH_TOOLS_MAX_VIEW_BYTES", cls.max_view_bytes, minimum=1024),
            max_upload_bytes=env_int(env, "AGENTMESH_TOOLS_MAX_UPLOAD_BYTES", cls.max_upload_bytes, minimum=1024),
        )
