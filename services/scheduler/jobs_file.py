"""The watched jobs file (AGENTMESH_SCHEDULER_JOBS_FILE): the leader reconciles the scheduler's
`file:<path>` jobs with it whenever its content changes.

Polling, not inotify: no inotify library is a dependency, and the file is usually a mounted
ConfigMap, which the kubelet replaces by swapping a symlink (inotify on the file sees nothing;
on a network volume it sees nothing at all). Reading a file of at most 1 MiB every couple of
seconds and comparing its hash costs next to nothing and catches every kind of change.

A file that cannot be read or has any error changes nothing: the error is logged and kept in
the status (`agentmesh cron list` shows it) until a corrected version is applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from pathlib import Path
from typing import Callable

from agentmesh.errors import AlreadyExists, InvalidArgument
from agentmesh.logs import get_logger
from agentmesh.scheduler.declared import MAX_FILE_BYTES, declared_jobs, plan_reconcile, read_document
from agentmesh.scheduler.engine import Scheduler

log = get_logger("agentmesh.scheduler.jobs_file")


@dataclasses.dataclass
class JobsFileStatus:
    path: str
    ok: bool = False
    error: str = ""  # with ok False: not read yet (only the active scheduler reads it)
    checked_at: float = 0.0
    applied_at: float = 0.0
    jobs: int = 0


class JobsFileWatcher:
    def __init__(self, core: Scheduler, path: Path, now: Callable[[], float]):
        self._core = core
        self._path = path
        self._now = now
        self.source = f"file:{path}"
        self.status = JobsFileStatus(path=str(path))
        # The hash of the content last dealt with (applied, or refused for an error in it): the
        # same content is not read into the store again.
        self._seen: str | None = None

    async def run(self, poll_s: float, stopping: asyncio.Event) -> None:
        """Every `poll_s`, as leader: reconcile if the file changed. Only the leader writes, so
        replicas do not race; a new leader reconciles once whatever it saw before."""
        while not stopping.is_set():
            if self._core.is_leader:
                try:
                    await self.check()
                except Exception:  # a failed round (the store busy, ...) is tried again next poll
                    log.exception("jobs file reconcile failed", path=str(self._path))
            else:
                self._seen = None
            try:
                await asyncio.wait_for(stopping.wait(), poll_s)
            except TimeoutError:
                pass

    async def check(self) -> None:
        now = self._now()
        self.status.checked_at = now
        try:
            data = await asyncio.to_thread(self._read)
        except OSError as exc:
            self._refuse(f"cannot read {self._path}: {exc.strerror or exc}", None)
            return
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._seen:
            return
        try:
            if len(data) > MAX_FILE_BYTES:
                raise InvalidArgument(f"{self._path} is larger than {MAX_FILE_BYTES // 1024} KiB")
            text = data.decode("utf-8")
            jobs = declared_jobs(read_document(text, self._path.name), self.source)
            plan = plan_reconcile(await self._core.list_jobs(), jobs, self.source, now)
        except UnicodeDecodeError:
            self._refuse(f"{self._path} is not UTF-8 text", digest)
            return
        except InvalidArgument as exc:
            self._refuse(exc.message, digest)  # the status names the path already
            return
        for job in plan.added:
            try:
                await self._core.create_job(job)
            except AlreadyExists:
                pass  # another instance, leading for a moment too, created it just now
        for job, changes in plan.changed:
            await self._core.update_job(job.job_id, changes)
        for job in plan.removed:
            await self._core.delete_job(job.job_id)
        self._seen = digest
        self.status = JobsFileStatus(path=str(self._path), ok=True, error="", checked_at=now, applied_at=now,
                                     jobs=len(jobs))
        if not plan.empty:
            log.info("jobs file applied", path=str(self._path), added=len(plan.added), changed=len(plan.changed),
                     removed=len(plan.removed))

    def _read(self) -> bytes:
        with self._path.open("rb") as handle:
            return handle.read(MAX_FILE_BYTES + 1)

    def _refuse(self, error: str, digest: str | None) -> None:
        if error != self.status.error or self.status.ok:
            log.error("jobs file not applied; the jobs stay as they were", path=str(self._path), error=error)
        self.status.ok, self.status.error = False, error
        self._seen = digest
