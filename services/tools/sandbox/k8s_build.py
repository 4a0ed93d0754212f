"""Building the cluster's session-sandbox executor (k8s_session.py) and its warm pool from settings."""

from __future__ import annotations

import os
import socket

from opentelemetry import trace

from agentmesh.tools.sandbox.agent_sandbox import SandboxClaims
from agentmesh.tools.sandbox.base import SandboxMetrics
from agentmesh.tools.sandbox.k8s_api import KubernetesJobs
from agentmesh.tools.sandbox.k8s_job import pod_identity
from agentmesh.tools.sandbox.k8s_pool import PoolSizing, WarmPool
from agentmesh.tools.sandbox.k8s_session import KubernetesSessionPods
from agentmesh.tools.sandbox.kubernetes import api_client_for
from agentmesh.tools.settings import ToolsSettings
from agentmesh.tools.workspace import Workspaces

__all__ = ["DEFAULT_TEMPLATE", "POOL_WINDOW_S", "session_pods"]

DEFAULT_TEMPLATE = "default"
# Claims counted for the pool's size: those of the last this many seconds.
POOL_WINDOW_S = 300.0


def session_pods(settings: ToolsSettings, workspaces: Workspaces | None, tracer: trace.Tracer,
                 metrics: SandboxMetrics | None = None, *, api: KubernetesJobs | None = None,
                 owner: str = "") -> KubernetesSessionPods:
    """Session pods for the template `settings` were made for (ToolsSettings.for_template), with a
    warm pool when AGENTMESH_SANDBOX_WARM_POOL_MAX is above 0, or claimed from agent-sandbox's
    SandboxWarmPool when the template names one (`agent_sandbox_pool`)."""
    cfg = settings.kubernetes
    api = api or KubernetesJobs(api_client_for(cfg), cfg.namespace, retries=cfg.api_retries)
    identity = pod_identity(cfg, os.getuid(), os.getgid())
    pool, claims = None, None
    if cfg.agent_sandbox_pool:
        # agent-sandbox's warm pool stands in for ours; the session's files stay in its pod (docs/tools.md).
        claims = SandboxClaims(api, cfg.agent_sandbox_pool, settings.template_name, cfg.start_timeout_s)
        workspaces = None
    elif cfg.warm_pool_max > 0:
        sizing = PoolSizing(cfg.warm_pool_min, cfg.warm_pool_max, POOL_WINDOW_S, cfg.warm_pool_idle_s)
        pool = WarmPool(api, cfg, identity, owner=owner or socket.gethostname(), template=DEFAULT_TEMPLATE,
                        workspace_root=workspaces.root if workspaces is not None else None,
                        network=settings.command_network, quota_bytes=settings.workspace_quota.limit_bytes,
                        sizing=sizing)
    return KubernetesSessionPods(api, cfg, settings.limits, workspaces, tracer, identity,
                                 quota=settings.workspace_quota, idle_s=settings.session_idle_s,
                                 network=settings.command_network, pool=pool, template=DEFAULT_TEMPLATE,
                                 metrics=metrics, claims=claims)
