"""Run webhooks (docs/api.md, "Webhooks"): when a run that names a webhook URL ends, its record
is POSTed there, signed the Standard Webhooks way, until the receiver answers 2xx.

Why the gateway delivers, not the scheduler: the gateway sees the run end and already writes
its record; the record is what makes the delivery durable. The run ends with `webhook_state`
"pending" in its final write, every attempt is written back to it (GetRun shows them), and a
gateway that starts resumes every pending delivery memory lists (ListRunRecords
webhook_pending) — so a restart loses none. Delivery is at least once: with several replicas
starting together, two may resume the same delivery; the receiver dedupes by `webhook-id`,
the run id, the same on every attempt (the scheduler's leader election would narrow that, at
the cost of a second service on every run's end).

Signing: `webhook-signature: v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">`
keyed with the namespace's secret ("whsec_" + base64 of the key; memory makes it on first use).
Egress: every connection goes through agentmesh.egress, the policy web_fetch uses; the URL is
also checked when the run is created, so a refused one is an error then, not a silent failure.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from typing import Any, Callable, Coroutine, Protocol

import httpx
from google.protobuf import json_format

from agentmesh import error_reasons
from agentmesh.egress import AddressPolicy, check_url, guarded_transport
from agentmesh.errors import InvalidArgument
from agentmesh.logs import get_logger
from agentmesh.tls import system_context
from agentmesh.v1 import sessions_pb2

__all__ = ["Webhooks", "sign"]

log = get_logger("agentmesh.gateway.webhooks")

MAX_URL_CHARS = 2048
ATTEMPT_TIMEOUT_S = 15.0
MAX_BACKOFF_S = 3600.0
# How long a namespace's default webhook is taken as read (a change made through another replica
# applies to runs ending after that; one made through this replica at once).
DEFAULT_TTL_S = 10.0
WEBHOOK_FIELDS = ("webhook_state", "webhook_attempts")  # not in the body: it is the same on every attempt


class WebhookRecords(Protocol):
    async def list_runs(self, request: sessions_pb2.ListRunRecordsRequest) -> sessions_pb2.ListRunRecordsResponse: ...
    async def webhook_secret(self, namespace: str) -> str: ...
    async def default_webhook(self, namespace: str) -> str: ...
    async def set_default_webhook(self, namespace: str, url: str) -> str: ...


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks signature header's value for one attempt."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class Webhooks:
    def __init__(self, records: WebhookRecords, allow_private: bool, retry_base_s: float, max_attempts: int,
                 save: Callable[[sessions_pb2.Run], None]):
        self._records = records
        self._policy = AddressPolicy(allow_private=allow_private)
        self._retry_base_s = retry_base_s
        self._max_attempts = max_attempts
        self._save = save  # writes the run back (its attempts and state), through the run ledger
        self._client = httpx.AsyncClient(transport=guarded_transport(self._policy, system_context(),
                                                                     "a run's webhook"),
                                         timeout=ATTEMPT_TIMEOUT_S, follow_redirects=False)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._defaults: dict[str, tuple[str, float]] = {}  # namespace -> (default URL, read at)

    async def check(self, url: str) -> None:
        """Refuse a URL the deliveries could not reach, with the sentence saying why."""
        if len(url) > MAX_URL_CHARS:
            raise InvalidArgument(f"webhook_url is longer than {MAX_URL_CHARS} characters", field="webhook_url",
                                  reason=error_reasons.URL_REFUSED)
        why = await check_url(url, self._policy, "a run's webhook")
        if why:
            raise InvalidArgument(f"webhook_url refused: {why}", field="webhook_url", reason=error_reasons.URL_REFUSED)

    def ended(self, run: sessions_pb2.Run) -> None:
        """A run ended: deliver it to its webhook, or to its namespace's default one if it has one.
        Off the turn's path: the default is read (and cached) by the delivery's own task."""
        if run.webhook_url:
            self.deliver(run)
        elif run.run_id not in self._tasks and self._cached_default(run.namespace) != "":
            # A namespace known to have no default (most, and every turn of theirs ends here)
            # starts no task and copies no record.
            self._track(run.run_id, self._to_default(_copy(run)))

    async def _to_default(self, run: sessions_pb2.Run) -> None:
        try:
            url = await self.default_url(run.namespace)
        except Exception as exc:  # noqa: BLE001 - memory away: this run goes unreported, and says so
            log.warning("namespace webhook not read; the run is not delivered", run_id=run.run_id, error=str(exc))
            return
        if url:
            run.webhook_url, run.webhook_state = url, "pending"
            self._save(run)  # pending, durably, before the first attempt
            await self._deliver(run)

    def _cached_default(self, namespace: str) -> str | None:
        """The namespace's default URL as read within DEFAULT_TTL_S ("" none), or None (read it)."""
        cached = self._defaults.get(namespace)
        if cached is not None and time.monotonic() - cached[1] < DEFAULT_TTL_S:
            return cached[0]
        return None

    async def default_url(self, namespace: str) -> str:
        cached = self._cached_default(namespace)
        if cached is not None:
            return cached
        url = await self._records.default_webhook(namespace)
        self._defaults[namespace] = (url, time.monotonic())
        return url

    async def set_default_url(self, namespace: str, url: str) -> str:
        if url:
            await self.check(url)
        stored = await self._records.set_default_webhook(namespace, url)
        self._defaults[namespace] = (stored, time.monotonic())
        return stored

    def _track(self, run_id: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks[run_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(run_id, None))

    def deliver(self, run: sessions_pb2.Run) -> None:
        """Deliver the ended run's record (once per run id at a time), in the background."""
        if run.run_id in self._tasks or run.webhook_state != "pending":
            return
        self._track(run.run_id, self._deliver(_copy(run)))

    async def resume(self) -> None:
        """At start: every delivery a gateway left pending."""
        try:
            pending = await self._records.list_runs(sessions_pb2.ListRunRecordsRequest(webhook_pending=True))
        except Exception as exc:  # noqa: BLE001 - memory away at start: the next start resumes them
            log.warning("pending webhooks not resumed", error=str(exc))
            return
        for run in pending.runs:
            self.deliver(run)

    async def _deliver(self, run: sessions_pb2.Run) -> None:
        body_of = sessions_pb2.Run()
        body_of.CopyFrom(run)
        for name in WEBHOOK_FIELDS:
            body_of.ClearField(name)
        body = json_format.MessageToJson(body_of, preserving_proto_field_name=True, indent=None).encode()
        secret = ""
        while len(run.webhook_attempts) < self._max_attempts:
            if run.webhook_attempts:
                backoff = self._retry_base_s * 2 ** (len(run.webhook_attempts) - 1)
                await asyncio.sleep(min(backoff, MAX_BACKOFF_S))
            status, error = 0, ""
            try:
                secret = secret or await self._records.webhook_secret(run.namespace)
                timestamp = int(time.time())
                answer = await self._client.post(run.webhook_url, content=body, headers={
                    "content-type": "application/json",
                    "webhook-id": run.run_id,
                    "webhook-timestamp": str(timestamp),
                    "webhook-signature": sign(secret, run.run_id, timestamp, body),
                })
                status = answer.status_code
            except Exception as exc:  # noqa: BLE001 - any failure is an attempt that failed, retried
                error = str(exc)[:500] or type(exc).__name__
            run.webhook_attempts.add(at=time.time(), status_code=status, error=error)
            if 200 <= status < 300:
                run.webhook_state = "delivered"
                self._save(run)
                log.info("webhook delivered", run_id=run.run_id, attempts=len(run.webhook_attempts))
                return
            self._save(run)
        run.webhook_state = "failed"
        self._save(run)
        log.warning("webhook not delivered", run_id=run.run_id, attempts=len(run.webhook_attempts))

    async def close(self) -> None:
        """On stop: pending deliveries stay pending in memory; the next start resumes them."""
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self._client.aclose()


def _copy(run: sessions_pb2.Run) -> sessions_pb2.Run:
    copy = sessions_pb2.Run()
    copy.CopyFrom(run)
    return copy
