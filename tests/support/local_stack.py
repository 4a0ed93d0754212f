"""`agentmesh up`'s five children (cli/stack.LocalStack) on ports picked free for the test, and
started again on new ones when one was taken before its service bound it.

A port is probed free (`free_address`) some time before the service binds it, and the suite's
other workers pick theirs from the same range: now and then one of them binds it first, and the
service exits with "the port is taken" (seen under load: the agent of one test's stack, its port
bound by another test's service a moment earlier). That says nothing of what the test checks,
so the stack is started again on new ports; any other failure to start is the test's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from agentmesh.cli.common import CliError
from agentmesh.cli.stack import LocalStack, free_address
from agentmesh.config import SERVICES

ATTEMPTS = 3


def on_free_ports(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with every service's address on a loopback port free now."""
    return {**env, **{f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES}}


def _port_was_taken(stack: LocalStack, error: CliError) -> bool:
    if "already in use" in str(error):  # LocalStack.check_ports, before any child started
        return True
    logs = stack.log_dir.glob("*.log") if stack.log_dir else []
    return any("the port is taken" in log.read_text(errors="replace") for log in logs)


async def start_healthy(stack: LocalStack) -> None:
    """Start the stack and wait until every service is SERVING, on new ports if one was taken."""
    for attempt in range(ATTEMPTS):
        try:
            stack.start()
            await stack.wait_healthy()
            return
        except CliError as error:
            await asyncio.to_thread(stack.stop)
            if attempt == ATTEMPTS - 1 or not _port_was_taken(stack, error):
                raise
            stack.env = on_free_ports(stack.env)
            for log in stack.log_dir.glob("*.log") if stack.log_dir else []:
                log.unlink()  # the next attempt's logs alone
