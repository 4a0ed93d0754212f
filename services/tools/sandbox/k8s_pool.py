"""A warm pool of session pods per template: pods started before any session asks, so a session's
first call in a cluster waits for an exec, not for a pod start.

Claiming. A warm pod carries `agentmesh.io/pool=warm`. A tools replica claims one with a JSON
merge patch that sets `pool=claimed` and the session's label, carrying the `resourceVersion` it
listed the pod at: the API server applies it only to that version, so when two replicas (or two
calls in one) pick the same pod, one patch wins and the other gets 409 Conflict and tries the
next pod. One pod is never handed to two sessions.

The workspace. A pod's volumes cannot change once it runs, and a warm pod cannot know the
session it will serve, so it does not mount the workspace root (every session's files, with
each call's cwd confined only by convention: one escape and a session reads all the others).
It mounts `subPath: @warm-pool/<pod name>` of the shared claim, an empty directory the tools
service made for it, which no session id can name. Claiming renames that directory to the
session's workspace (`renameat2(RENAME_NOREPLACE)` on the claim the tools service mounts too):
the bind mount follows the directory, so the pod now sees exactly the session's workspace, as a
cold pod with `subPath: <session>` would, and nothing else. This works for a session with no
files yet (its first call; an empty workspace directory is replaced). A session that already
has files, or a rename the file system refuses (no RENAME_NOREPLACE), gets a cold pod instead:
files are never moved under a running program. Without a shared claim the workspace is the
pod's own emptyDir and the claim hands the pod over as it is.

Ready to answer. A replica opens the session supervisor's stream (k8s_supervisor.py) on each of
its own warm pods once they run (`prepare`, in the refill loop), so a session's first call on a
pod it claims is a request on an open stream, no exec in its path; a replica claims its own
prepared pods first. The supervisor holds nothing of a session before the claim: its working
directory is the pod's /workspace mount, which shows the session's workspace once the claim has
renamed the directory under it; the calls it starts resolve /workspace when they start.

Sizing. Each replica keeps `target` warm pods of its own: the claims it saw in the last
`window_s`, between `floor` and `ceiling`; with no claim for `idle_s` once it first held its size,
zero (pods it made are retired: claimed by the same patch, then deleted, so a pod being claimed
elsewhere is never deleted under it). Any replica retires warm pods older than `max_age_s` (those of a replica that
went away, and stale ones). Refill runs in the background, never in a call's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import random
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Awaitable, Callable

from agentmesh.logs import get_logger
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_job import CONTAINER, LABEL_SESSION, label_value
from agentmesh.tools.sandbox.k8s_session_pod import (
    ANNOTATION_SESSION,
    LABEL_POOL,
    LABEL_TEMPLATE,
    POOL_DIR,
    SESSION_PODS,
    build_session_pod,
    session_pod_name,
)
from agentmesh.tools.sandbox.k8s_session_reap import ANNOTATION_LAST_USED
from agentmesh.tools.settings import KubernetesSandbox
from agentmesh.tools.tree_delete import remove_tree

__all__ = ["LABEL_POOL_OWNER", "PoolSizing", "WarmPool", "bind_workspace"]

log = get_logger("agentmesh.tools.kubernetes.pool")

LABEL_POOL_OWNER = "agentmesh.io/pool-owner"
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def bind_workspace(slot: Path, workspace: Path) -> bool:
    """Rename the warm pod's directory to the session's workspace, never over one with files
    (and never over one another claim bound first). False when that cannot be done."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    with contextlib.suppress(FileNotFoundError, OSError):
        workspace.rmdir()  # only if empty: a session's files are never touched
    if renameat2(_AT_FDCWD, os.fsencode(slot), _AT_FDCWD, os.fsencode(workspace), _RENAME_NOREPLACE) == 0:
        return True
    code = ctypes.get_errno()
    if code not in (errno.EEXIST, errno.ENOTEMPTY):
        log.warning("could not bind a warm pod's workspace; the session gets a cold pod", error=os.strerror(code))
    return False


class PoolSizing:
    """How many warm pods this replica keeps: recent demand, within a floor and a ceiling, zero when idle."""

    def __init__(self, floor: int, ceiling: int, window_s: float, idle_s: float):
        self.floor, self.ceiling, self.window_s, self.idle_s = floor, max(ceiling, floor), window_s, idle_s
        self._claims: deque[float] = deque()
        self._last = time.monotonic()  # a start counts as activity: the first sessions find pods
        self._filling = True

    def started(self) -> None:
        """The pool starts (again): that counts as activity, however long the service took to get here."""
        self._last = time.monotonic()
        self._filling = True

    def filled(self) -> None:
        """The pool holds its size for the first time since it started: its idle time counts from
        here. A pool still making its first pods (a slow API server, a busy node) has not been idle;
        counted from the start, it could retire before it ever held a pod to claim."""
        if self._filling:
            self._filling = False
            self._last = time.monotonic()

    def claimed(self) -> None:
        now = time.monotonic()
        self._claims.append(now)
        self._last = now

    def target(self) -> int:
        now = time.monotonic()
        while self._claims and now - self._claims[0] > self.window_s:
            self._claims.popleft()
        if not self._filling and now - self._last >= self.idle_s:
            return 0
        return min(max(len(self._claims), self.floor), self.ceiling)


class WarmPool:
    def __init__(self, api: KubernetesJobs, cfg: KubernetesSandbox, identity: tuple[int, int], *, owner: str,
                 template: str = "default", workspace_root: Path | None = None, network: bool = False,
                 quota_bytes: int, sizing: PoolSizing, max_age_s: float = 1800.0, interval_s: float = 1.0):
        self._api = api
        self._cfg = cfg
        self._identity = identity
        self.owner = label_value(owner)
        self.template = template
        self._root = workspace_root if cfg.workspace_pvc else None
        self._network = network
        self._quota_bytes = quota_bytes
        self.sizing = sizing
        self._max_age_s = max_age_s
        self._interval_s = interval_s
        self._selector = f"{SESSION_PODS},{LABEL_TEMPLATE}={label_value(template)},{LABEL_POOL}=warm"
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.claims = 0  # claims that got a warm pod (for tests and benches)
        # Set by the session executor: open a running warm pod's supervisor stream; whether one is open.
        self.prepare: Callable[[str], Awaitable[None]] | None = None
        self.prepared: Callable[[str], bool] = lambda name: False

    def start(self) -> None:
        if self._task is None or self._task.done():
            self.sizing.started()
            self._task = asyncio.create_task(self._refill())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- claiming ------------------------------------------------------------------------------

    async def claim(self, session_id: str, workspace: Path | None) -> str | None:
        """A warm, running pod now the session's (its workspace bound), or None: start a cold one."""
        self.sizing.claimed()
        self._wake.set()
        if workspace is not None and await asyncio.to_thread(_has_files, workspace):
            return None  # a session with files already: only a cold pod mounts them
        while True:
            # Each round at least one of the claims that conflicted won: this ends.
            pods, _ = await self._api.list_pods(self._selector)
            ready = [p for p in pods if _running(p) and not p["metadata"].get("deletionTimestamp")]
            if not ready:
                return None
            random.shuffle(ready)  # replicas claiming at once mostly pick different pods
            ready.sort(key=lambda p: not self.prepared(p["metadata"]["name"]))  # this replica's ready ones first
            conflicted = False
            for pod in ready:
                name = pod["metadata"]["name"]
                if not await self._patch_claim(pod, session_id):
                    conflicted = True
                    continue
                slot = self._root / POOL_DIR / name if self._root is not None else None
                if slot is not None and workspace is not None and not await asyncio.to_thread(bind_workspace, slot, workspace):
                    await self._retire_claimed(name)
                    return None
                self.claims += 1
                return name
            if not conflicted:
                return None

    async def _patch_claim(self, pod: dict[str, Any], session_id: str, state: str = "claimed") -> bool:
        meta = pod["metadata"]
        patch: dict[str, Any] = {"metadata": {"resourceVersion": meta["resourceVersion"], "labels": {LABEL_POOL: state}}}
        if session_id:
            patch["metadata"]["labels"][LABEL_SESSION] = label_value(session_id)
            # The claim is a use: a warm pod made long ago is, once claimed, a session pod that any
            # replica's sweep would otherwise judge abandoned by its age (k8s_session_reap.py).
            patch["metadata"]["annotations"] = {ANNOTATION_SESSION: session_id,
                                                ANNOTATION_LAST_USED: f"{time.time():.3f}"}
        try:
            await self._api.patch_pod(meta["name"], patch)
        except KubeApiError as exc:
            if exc.status in (404, 409):
                return False  # another claim won it, or it is gone
            raise
        return True

    async def _retire_claimed(self, name: str) -> None:
        with contextlib.suppress(KubeApiError):
            await self._api.delete_pod(name)
        if self._root is not None:
            await asyncio.to_thread(_remove_slot, self._root / POOL_DIR / name)

    # --- refilling -----------------------------------------------------------------------------

    async def _refill(self) -> None:
        while True:
            try:
                await self.refill_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the pool is an optimisation: log, try again
                log.warning("warm pool refill failed", template=self.template, error=str(exc))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval_s)

    async def refill_once(self) -> None:
        pods, _ = await self._api.list_pods(self._selector)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        now = datetime.now(UTC)
        for pod in live:
            if _age_s(pod, now) > self._max_age_s and await self._patch_claim(pod, "", "retired"):
                await self._retire_claimed(pod["metadata"]["name"])
        live = [p for p in live if _age_s(p, now) <= self._max_age_s]
        target = self.sizing.target()
        mine = [p for p in live if p["metadata"].get("labels", {}).get(LABEL_POOL_OWNER) == self.owner]
        for pod in mine[target:]:
            if await self._patch_claim(pod, "", "retired"):
                await self._retire_claimed(pod["metadata"]["name"])
        missing = target - len(live)
        if missing > 0:
            await asyncio.gather(*(self._create() for _ in range(missing)))
        else:
            self.sizing.filled()
        if self.prepare is not None:
            names = [p["metadata"]["name"] for p in mine[:target] if _running(p)]
            await asyncio.gather(*(self.prepare(name) for name in names if not self.prepared(name)))

    async def _create(self) -> None:
        name = session_pod_name(warm=True)
        body = build_session_pod(self._cfg, name, self._identity, template=self.template, network=self._network,
                                 quota_bytes=self._quota_bytes)
        body["metadata"]["labels"][LABEL_POOL_OWNER] = self.owner
        if self._root is not None:
            slot = self._root / POOL_DIR / name
            await asyncio.to_thread(_make_slot, slot, self._identity)
        await self._api.create_pod(body)


def _running(pod: dict[str, Any]) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER and "running" in (status.get("state") or {}):
            return True
    return False


def _age_s(pod: dict[str, Any], now: datetime) -> float:
    stamp = pod["metadata"].get("creationTimestamp")
    if not stamp:
        return 0.0
    try:
        created = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    return (now - created).total_seconds()


def _has_files(workspace: Path) -> bool:
    return workspace.is_dir() and any(workspace.iterdir())


def _make_slot(slot: Path, identity: tuple[int, int]) -> None:
    slot.parent.mkdir(mode=0o711, exist_ok=True)
    slot.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(slot, *identity)


def _remove_slot(slot: Path) -> None:
    if slot.is_dir() and not slot.is_symlink():
        remove_tree(slot)
