"""AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION=true: command tools as plain child processes. NOT a sandbox.

For machines without bubblewrap where the operator accepts that model-written programs run with
the service's own user, file system and network. The environment is still the clean one, the
working directory the workspace, and rlimits, wall clock and output cap still apply; a program
that calls setsid() can outlive the call.
"""

from __future__ import annotations

import resource
import shutil

from opentelemetry import trace

from agentmesh.logs import get_logger
from agentmesh.telemetry.genai import GEN_AI_TOOL_CALL_ID
from agentmesh.telemetry.propagation import traceparent_env
from agentmesh.tools.quota import UsageMeter
from agentmesh.tools.sandbox.base import CommandResult, CommandSpec
from agentmesh.tools.sandbox.local import clean_environment, interpret, rlimit_prefix
from agentmesh.tools.sandbox.process import run_process
from agentmesh.tools.sandbox.quota_results import apply_quota
from agentmesh.tools.settings import SandboxLimits, ToolsSettings
from agentmesh.tools.workspace import Workspaces

log = get_logger("agentmesh.tools.sandbox")


def _limit_child(limits: SandboxLimits, file_size_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_bytes, file_size_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _system_prlimit() -> str:
    return shutil.which("prlimit", path="/usr/bin:/bin:/usr/local/bin") or ""


class UnsafeHostExecutor:
    name = "unsafe-no-isolation"

    def __init__(self, settings: ToolsSettings, workspaces: Workspaces, tracer: trace.Tracer):
        self._limits = settings.limits
        self._quota = settings.workspace_quota
        self._meter = UsageMeter(threads=1)
        self._workspaces = workspaces
        self._tracer = tracer
        log.warning(
            "AGENTMESH_SANDBOX_UNSAFE_NO_ISOLATION is set: command tools run UNSANDBOXED as this service's user"
        )

    async def run(self, spec: CommandSpec) -> CommandResult:
        workspace = self._workspaces.ensure(spec.session_id)
        # Only the per-file limit bounds the workspace here (nothing watches the total while the
        # program runs); the result names the quota afterwards.
        used_before = await self._meter.usage(workspace)
        file_size = min(self._limits.file_size_bytes, self._quota.remaining(used_before))
        with self._tracer.start_as_current_span(
            "sandbox.unsafe_process",
            attributes={"agentmesh.sandbox.executor": self.name, GEN_AI_TOOL_CALL_ID: spec.call_id},
        ) as span:
            env = clean_environment(traceparent_env())
            env["HOME"] = str(workspace)
            prlimit = _system_prlimit()
            # prlimit, not preexec_fn: a preexec_fn makes Python fork() instead of vfork(), and
            # fork in this multi-threaded process (gRPC) can crash the child before it execs.
            argv = [*rlimit_prefix(self._limits, prlimit, file_size), *spec.argv] if prlimit else list(spec.argv)
            run = await run_process(
                argv,
                env=env,
                cwd=str(workspace),
                timeout_s=spec.timeout_s,
                output_cap=self._limits.output_cap_bytes,
                drain_limit=self._limits.output_drain_bytes,
                preexec_fn=None if prlimit else _limit_child(self._limits, file_size),
            )
            result = interpret(run, spec, self._limits)
            used_after = await self._meter.usage(workspace)
            apply_quota(result, self._quota, used_before, used_after, file_size < self._limits.file_size_bytes, stopped=False)
            span.set_attribute("agentmesh.sandbox.exit_code", result.exit_code)
            return result

    async def close(self) -> None:
        self._meter.close()
