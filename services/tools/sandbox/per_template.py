"""One executor per sandbox template (templates.py), built on a template's first call.

`default`'s is the service's own executor (what the settings describe); another template's is
built the same way from the settings with that template's sizes, image, runtime class and
isolation (`ToolsSettings.for_template`), so a `session` template gets session sandboxes and a
`call` template a fresh jail or pod per call, side by side in one service.
"""

from __future__ import annotations

from typing import Callable

from agentmesh import error_reasons
from agentmesh.errors import InvalidArgument
from agentmesh.tools.sandbox.base import Executor, SessionKernel
from agentmesh.tools.sandbox.templates import DEFAULT_TEMPLATE, SandboxTemplate, TemplateSet

__all__ = ["TemplateSandboxes", "unknown_template"]


def unknown_template(templates: TemplateSet, name: str, field: str = "sandbox_template") -> InvalidArgument:
    return InvalidArgument(templates.unknown_detail(name), reason=error_reasons.UNKNOWN_SANDBOX_TEMPLATE,
                           metadata={"field": field, "template": name[:80]})


class TemplateSandboxes:
    """Executors by template name; `build` makes one for a template (server.make_executor)."""

    def __init__(self, templates: TemplateSet, default: Executor, build: Callable[[SandboxTemplate], Executor]):
        self.templates = templates
        self._build = build
        # By (template, isolation): an agent may ask for a template's sandbox with the other isolation.
        self._executors: dict[tuple[str, str], Executor] = {(DEFAULT_TEMPLATE, templates.default.isolation): default}

    def template(self, name: str) -> SandboxTemplate:
        """The template `name` names ("": default); INVALID_ARGUMENT (UNKNOWN_SANDBOX_TEMPLATE) when none."""
        template = self.templates.get(name)
        if template is None:
            raise unknown_template(self.templates, name)
        return template

    def executor(self, template: SandboxTemplate) -> Executor:
        key = (template.name, template.isolation)
        executor = self._executors.get(key)
        if executor is None:
            executor = self._executors[key] = self._build(template)
        return executor

    def kernel(self, template: SandboxTemplate) -> SessionKernel | None:
        """The template's session sandboxes, when its isolation is `session` (a jail or a pod per session)."""
        executor = self.executor(template)
        return executor if isinstance(executor, SessionKernel) else None

    async def end_session(self, session_id: str) -> None:
        # Local session jails and a cluster's session pods alike end with their workspace.
        for executor in list(self._executors.values()):
            end = getattr(executor, "end_session", None)
            if end is not None:
                await end(session_id)

    async def close(self) -> None:
        """Close the executors built here (the default one is its owner's to close)."""
        default = (DEFAULT_TEMPLATE, self.templates.default.isolation)
        for key, executor in list(self._executors.items()):
            if key != default:
                await executor.close()
