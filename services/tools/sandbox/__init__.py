"""Executors that run model-written programs in isolation: a bubblewrap jail or a Kubernetes Job pod."""

from agentmesh.tools.sandbox.base import CommandResult, CommandSpec, Executor, SandboxUnavailable

__all__ = ["CommandResult", "CommandSpec", "Executor", "SandboxUnavailable"]
