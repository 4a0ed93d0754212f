"""Per-tenant limits the gateway enforces: turns running at once, and model tokens per day.

Counted in this gateway replica, from what each turn reports (`run_finished.usage`): with N
replicas a tenant may run up to N times its concurrent turns, and a day's tokens are counted
per replica. A turn is refused before it starts once the tenant is at its limit; a turn
already running finishes (its tokens count towards the day). The workspace disk limit is the
tools service's (AGENTMESH_TOOLS_WORKSPACE_QUOTA_MB per session).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentmesh import error_reasons
from agentmesh.errors import ResourceExhausted
from agentmesh.tenancy import AuthPolicy, TenantLimits

__all__ = ["Admission", "TenantLimiter"]

DAY_S = 86_400


@dataclass
class Admission:
    limiter: "TenantLimiter | None"
    tenant: str
    released: bool = False

    def release(self) -> None:
        if not self.released and self.limiter is not None:
            self.released = True
            self.limiter.finished(self.tenant)


class TenantLimiter:
    def __init__(self, policy: AuthPolicy | None):
        self._policy = policy
        self._running: dict[str, int] = {}
        self._tokens: dict[str, tuple[int, int]] = {}  # tenant -> (UTC day number, tokens that day)

    def _limits(self, tenant: str) -> TenantLimits | None:
        if self._policy is None or not self._policy.enforced or tenant not in self._policy.tenants:
            return None
        return self._policy.tenants[tenant].limits

    def tokens_today(self, tenant: str) -> int:
        day, used = self._tokens.get(tenant, (0, 0))
        return used if day == int(time.time() // DAY_S) else 0

    def admit(self, tenant: str) -> Admission:
        """Count a turn of `tenant` in, or refuse it naming the limit it would pass."""
        limits = self._limits(tenant)
        if limits is None:
            return Admission(None, tenant)
        if limits.tokens_per_day and self.tokens_today(tenant) >= limits.tokens_per_day:
            raise ResourceExhausted(
                f"tenant {tenant!r} has used its {limits.tokens_per_day} model tokens for today "
                f"(limits.tokens_per_day); it resets at 00:00 UTC",
                reason=error_reasons.QUOTA_EXCEEDED, metadata={"limit": "tokens_per_day", "tenant": tenant},
            )
        running = self._running.get(tenant, 0)
        if limits.concurrent_turns and running >= limits.concurrent_turns:
            raise ResourceExhausted(
                f"tenant {tenant!r} already runs {running} turns at once, its limit (limits.concurrent_turns); "
                "wait for one to finish",
                reason=error_reasons.QUOTA_EXCEEDED, metadata={"limit": "concurrent_turns", "tenant": tenant},
            )
        self._running[tenant] = running + 1
        return Admission(self, tenant)

    def finished(self, tenant: str) -> None:
        self._running[tenant] = max(0, self._running.get(tenant, 0) - 1)

    def count_tokens(self, tenant: str, tokens: int) -> None:
        if tokens <= 0 or self._limits(tenant) is None:
            return
        today = int(time.time() // DAY_S)
        self._tokens[tenant] = (today, self.tokens_today(tenant) + tokens)
