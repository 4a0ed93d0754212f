"""Scheduler knobs, read once from the environment at start-up (`AGENTMESH_SCHEDULER_*`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from agentmesh.config import ConfigError, env_choice, env_float, env_int, env_str

# Where a pod finds its own namespace when AGENTMESH_SCHEDULER_NAMESPACE is not set.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _pod_namespace() -> str:
    try:
        return POD_NAMESPACE_FILE.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class SchedulerSettings:
    # "file": a lock file under the data directory (one machine); "lease": a Kubernetes Lease.
    lock: str = "file"
    lease_name: str = "agentmesh-scheduler"
    namespace: str = "default"
    # A leader that has not renewed for this long is presumed dead and may be replaced.
    lease_duration_s: float = 15.0
    # How often leadership is renewed (or tried for) and liveness is recorded.
    renew_s: float = 5.0
    # Longest the firing loop sleeps without looking at the store: jobs created through
    # another replica's API reach the leader within this time.
    poll_s: float = 1.0
    # A run that starts later than this after its due time counts as missed (after downtime),
    # and the job's missed-run policy decides what happens.
    misfire_grace_s: float = 60.0
    run_timeout_s: float = 1800.0
    # Run records kept per job; older ones are pruned.
    history_limit: int = 200
    max_jobs: int = 100_000
    # SQLite journal: "wal" on a local disk; "delete" when the data directory is a network volume.
    journal_mode: str = "wal"
    # Idle reflection (idle_reflection.py): a session idle this long with new entries is reflected
    # on (0: never); the leader looks every `reflect_check_s`; a failure is retried after
    # `reflect_retry_s`, doubling.
    reflect_idle_s: float = 600.0
    reflect_check_s: float = 60.0
    reflect_retry_s: float = 300.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "SchedulerSettings":
        renew_s = env_float(env, "AGENTMESH_SCHEDULER_RENEW_S", cls.renew_s, minimum=0.05)
        lease_s = env_float(env, "AGENTMESH_SCHEDULER_LEASE_DURATION_S", cls.lease_duration_s, minimum=1)
        if lease_s <= renew_s:
            raise ConfigError(
                f"AGENTMESH_SCHEDULER_LEASE_DURATION_S ({lease_s}) must be longer than "
                f"AGENTMESH_SCHEDULER_RENEW_S ({renew_s}), or leadership would lapse between renewals"
            )
        return cls(
            lock=env_choice(env, "AGENTMESH_SCHEDULER_LOCK", cls.lock, ("file", "lease")),
            lease_name=env_str(env, "AGENTMESH_SCHEDULER_LEASE_NAME", cls.lease_name),
            namespace=env_str(env, "AGENTMESH_SCHEDULER_NAMESPACE") or _pod_namespace() or cls.namespace,
            lease_duration_s=lease_s,
            renew_s=renew_s,
            poll_s=env_float(env, "AGENTMESH_SCHEDULER_POLL_S", cls.poll_s, minimum=0.01),
            misfire_grace_s=env_float(env, "AGENTMESH_SCHEDULER_MISFIRE_GRACE_S", cls.misfire_grace_s, minimum=0),
            run_timeout_s=env_float(env, "AGENTMESH_SCHEDULER_RUN_TIMEOUT_S", cls.run_timeout_s, minimum=1),
            history_limit=env_int(env, "AGENTMESH_SCHEDULER_HISTORY_LIMIT", cls.history_limit, minimum=1),
            max_jobs=env_int(env, "AGENTMESH_SCHEDULER_MAX_JOBS", cls.max_jobs, minimum=1),
            journal_mode=env_choice(env, "AGENTMESH_SCHEDULER_JOURNAL", cls.journal_mode, ("wal", "delete")),
            reflect_idle_s=env_float(env, "AGENTMESH_REFLECT_IDLE_S", cls.reflect_idle_s, minimum=0),
            reflect_check_s=env_float(env, "AGENTMESH_REFLECT_CHECK_S", cls.reflect_check_s, minimum=0.05),
            reflect_retry_s=env_float(env, "AGENTMESH_REFLECT_RETRY_S", cls.reflect_retry_s, minimum=0.05),
        )
