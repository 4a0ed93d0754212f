"""Scheduler knobs, read once from the environment at start-up (`AGENTMESH_SCHEDULER_*`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentmesh.config import ConfigError, EnvSection, env

# Where a pod finds its own namespace when AGENTMESH_SCHEDULER_NAMESPACE is not set.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _pod_namespace() -> str:
    try:
        return POD_NAMESPACE_FILE.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class SchedulerSettings(EnvSection):
    # "file": a lock file under the data directory (one machine); "lease": a Kubernetes Lease.
    lock: str = env("AGENTMESH_SCHEDULER_LOCK", "file", choices=("file", "lease"))
    lease_name: str = env("AGENTMESH_SCHEDULER_LEASE_NAME", "agentmesh-scheduler")
    namespace: str = env("AGENTMESH_SCHEDULER_NAMESPACE", "")  # "": the pod's own, else "default"
    # A leader that has not renewed for this long is presumed dead and may be replaced.
    lease_duration_s: float = env("AGENTMESH_SCHEDULER_LEASE_DURATION_S", 15.0, minimum=1)
    # How often leadership is renewed (or tried for) and liveness is recorded.
    renew_s: float = env("AGENTMESH_SCHEDULER_RENEW_S", 5.0, minimum=0.05)
    # Longest the firing loop sleeps without looking at the store: jobs created through
    # another replica's API reach the leader within this time.
    poll_s: float = env("AGENTMESH_SCHEDULER_POLL_S", 1.0, minimum=0.01)
    # A run that starts later than this after its due time counts as missed (after downtime),
    # and the job's missed-run policy decides what happens.
    misfire_grace_s: float = env("AGENTMESH_SCHEDULER_MISFIRE_GRACE_S", 60.0, minimum=0)
    run_timeout_s: float = env("AGENTMESH_SCHEDULER_RUN_TIMEOUT_S", 1800.0, minimum=1)
    # Run records kept per job; older ones are pruned.
    history_limit: int = env("AGENTMESH_SCHEDULER_HISTORY_LIMIT", 200, minimum=1)
    max_jobs: int = env("AGENTMESH_SCHEDULER_MAX_JOBS", 100_000, minimum=1)
    # SQLite journal: "wal" on a local disk; "delete" when the data directory is a network volume.
    journal_mode: str = env("AGENTMESH_SCHEDULER_JOURNAL", "wal", choices=("wal", "delete"))
    # Jobs declared in a file (jobs_file.py; a JSON or YAML list, in a cluster a mounted ConfigMap):
    # the leader keeps the scheduler's jobs of that file equal to it. "": no jobs file.
    jobs_file: str = env("AGENTMESH_SCHEDULER_JOBS_FILE", "")
    # How often the jobs file is read for changes (its hash compared).
    jobs_file_poll_s: float = env("AGENTMESH_SCHEDULER_JOBS_FILE_POLL_S", 2.0, minimum=0.05)
    # Idle reflection (idle_reflection.py): a session idle this long with new entries is reflected
    # on (0: never); the leader looks every `reflect_check_s`; a failure is retried after
    # `reflect_retry_s`, doubling.
    reflect_idle_s: float = env("AGENTMESH_REFLECT_IDLE_S", 600.0, minimum=0)
    reflect_check_s: float = env("AGENTMESH_REFLECT_CHECK_S", 60.0, minimum=0.05)
    reflect_retry_s: float = env("AGENTMESH_REFLECT_RETRY_S", 300.0, minimum=0.05)
    # Retention (docs/memory.md#retention): the leader asks the gateway to sweep this often
    # (0: never), each sweep at most this many bounded passes per namespace.
    retention_sweep_s: float = env("AGENTMESH_RETENTION_SWEEP_S", 3600.0, minimum=0)
    retention_passes: int = env("AGENTMESH_RETENTION_PASSES", 100, minimum=1)

    # Agent resources (docs/agents.md): the leader relists each managed namespace's `Agent`
    # resources at least this often (between relists a watch brings every change at once).
    agent_resync_s: float = env("AGENTMESH_SCHEDULER_AGENT_RESYNC_S", 300.0, minimum=1)

    def __post_init__(self) -> None:
        if self.lease_duration_s <= self.renew_s:
            raise ConfigError(
                f"AGENTMESH_SCHEDULER_LEASE_DURATION_S ({self.lease_duration_s}) must be longer than "
                f"AGENTMESH_SCHEDULER_RENEW_S ({self.renew_s}), or leadership would lapse between renewals"
            )
        if not self.namespace:
            object.__setattr__(self, "namespace", _pod_namespace() or "default")
