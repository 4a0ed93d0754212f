"""Runs as the gateways record them (sessions.proto `Run`, docs/api.md "Runs"): one record per
turn, written when it starts, when it waits for an approval and when it ends, read back by any
gateway replica for GetRun, ListRuns, JoinRun and CancelRun.

`DocumentRuns` implements the `RunStore` port over the document port (kind "run", keyed by the
run id in its namespace), so both adapters keep runs where transcripts live without a collection
of their own. A run is read by id alone (GetRun names no namespace), so a second small document
(kind "run_where", in the reserved namespace RUN_INDEX) says which namespace holds it.
`Runs` is the core: it checks what a gateway sends and pages through a namespace's runs.

A run whose webhook delivery is pending is also listed in RUN_INDEX (kind "run_webhook"), so a
gateway that starts finds the deliveries to resume without reading every namespace. Each
namespace's webhook signing secret is a document too (`WebhookSecrets`), made on first use.
"""

from __future__ import annotations

import base64
import re
import secrets
from typing import Any

from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.memory.ports import DocumentStore, Payload, RunStore

__all__ = ["RUN_STATES", "DocumentRuns", "Runs", "WebhookSecrets"]

KIND = "run"
WHERE_KIND = "run_where"
PENDING_KIND = "run_webhook"
SECRET_KIND = "webhook_secret"
DEFAULT_KIND = "webhook_default"
MAX_URL_CHARS = 2048
RUN_INDEX = "_runs"  # not a valid namespace name (validate_namespace), so no tenant's documents
RUN_STATES = ("queued", "running", "waiting_for_approval", "succeeded", "failed", "cancelled", "interrupted")
MAX_PAGE_SIZE = 500
RUN_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class DocumentRuns:
    """The RunStore port over a DocumentStore."""

    def __init__(self, documents: DocumentStore):
        self._documents = documents

    async def put_run(self, payload: Payload) -> None:
        run_id, namespace = str(payload["run_id"]), str(payload["namespace"])
        # The index first: a run found by id is always readable, even if the record lags a moment.
        where = await self._documents.get_document(WHERE_KIND, RUN_INDEX, run_id)
        if where is None or where.get("namespace") != namespace:
            await self._documents.put_document(WHERE_KIND, RUN_INDEX, run_id, {"namespace": namespace})
        await self._documents.put_document(KIND, namespace, run_id, payload)
        if where is not None and where.get("namespace") != namespace:
            # The gateway learnt the session's namespace from the turn's start (run_started):
            # the run moves there, and is listed in one namespace only.
            await self._documents.delete_document(KIND, str(where["namespace"]), run_id)
        if payload.get("webhook_state") == "pending":
            await self._documents.put_document(PENDING_KIND, RUN_INDEX, run_id, {"namespace": namespace})
        elif payload.get("webhook_url"):
            await self._documents.delete_document(PENDING_KIND, RUN_INDEX, run_id)

    async def pending_webhooks(self) -> list[Payload]:
        """Every run whose webhook delivery is pending, of every namespace."""
        runs = []
        for run_id, where in await self._documents.list_documents(PENDING_KIND, RUN_INDEX):
            run = await self._documents.get_document(KIND, str(where["namespace"]), run_id)
            if run is not None and run.get("webhook_state") == "pending":
                runs.append(dict(run))
        return runs

    async def get_run(self, run_id: str) -> Payload | None:
        where = await self._documents.get_document(WHERE_KIND, RUN_INDEX, run_id)
        if where is None:
            return None
        return await self._documents.get_document(KIND, str(where["namespace"]), run_id)

    async def list_runs(self, namespace: str, session_id: str = "") -> list[Payload]:
        runs = [dict(body) for _, body in await self._documents.list_documents(KIND, namespace)
                if not session_id or body.get("session_id") == session_id]
        runs.sort(key=lambda r: (-float(r.get("created_at", 0.0)), str(r["run_id"])))
        return runs


class WebhookSecrets:
    """Each namespace's webhook signing secret, in the Standard Webhooks form ("whsec_" and the
    base64 of 32 random bytes), made the first time it is asked for."""

    def __init__(self, documents: DocumentStore):
        self._documents = documents

    async def get(self, namespace: str) -> str:
        namespace = validate_namespace(namespace or "default")
        stored = await self._documents.get_document(SECRET_KIND, namespace, "v1")
        if stored is not None:
            return str(stored["secret"])
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        await self._documents.put_document(SECRET_KIND, namespace, "v1", {"secret": secret})
        return secret

    async def default_url(self, namespace: str) -> str:
        stored = await self._documents.get_document(DEFAULT_KIND, validate_namespace(namespace or "default"), "url")
        return str(stored["url"]) if stored is not None else ""

    async def set_default_url(self, namespace: str, url: str) -> str:
        """Set (or with "" remove) the namespace's default webhook; the gateway checked the URL."""
        namespace = validate_namespace(namespace or "default")
        if len(url) > MAX_URL_CHARS or (url and not url.startswith(("http://", "https://"))):
            raise InvalidArgument(f"default_url must be an http(s) URL of at most {MAX_URL_CHARS} characters",
                                  field="default_url")
        if url:
            await self._documents.put_document(DEFAULT_KIND, namespace, "url", {"url": url})
        else:
            await self._documents.delete_document(DEFAULT_KIND, namespace, "url")
        return url


class Runs:
    def __init__(self, store: RunStore):
        self._store = store

    async def pending_webhooks(self) -> list[dict[str, Any]]:
        return await self._store.pending_webhooks()

    async def put(self, run: dict[str, Any]) -> dict[str, Any]:
        """Store the run as the gateway sends it (a put replaces the record)."""
        run_id = str(run.get("run_id", ""))
        if not RUN_ID.match(run_id):
            raise InvalidArgument(f"run_id {run_id[:64]!r} must be 1-128 letters, digits, '.', '_', ':' or '-'",
                                  field="run_id")
        validate_id(str(run.get("session_id", "")))
        run["namespace"] = validate_namespace(str(run.get("namespace") or "default"))
        state = run.get("state", "")
        if state not in RUN_STATES:
            raise InvalidArgument(f"state {str(state)[:40]!r} is not one of {', '.join(RUN_STATES)}", field="state")
        await self._store.put_run(run)
        return run

    async def get(self, run_id: str) -> dict[str, Any]:
        if not RUN_ID.match(run_id):
            raise InvalidArgument(f"run_id {run_id[:64]!r} must be 1-128 letters, digits, '.', '_', ':' or '-'",
                                  field="run_id")
        run = await self._store.get_run(run_id)
        if run is None:
            raise NotFound(f"there is no run {run_id!r}")
        return dict(run)

    async def list(self, namespace: str, session_id: str, states: list[str], created_after: float,
                   created_before: float, page_size: int, page_token: str) -> tuple[list[dict[str, Any]], str]:
        """A page of the namespace's runs, newest first, and the next page's token ('' at the end)."""
        namespace = validate_namespace(namespace or "default")
        if session_id:
            validate_id(session_id)
        unknown = [s for s in states if s not in RUN_STATES]
        if unknown:
            raise InvalidArgument(f"state {unknown[0][:40]!r} is not one of {', '.join(RUN_STATES)}", field="states")
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be between 0 and {MAX_PAGE_SIZE}, got {page_size}", field="page_size")
        if created_after < 0 or created_before < 0:
            raise InvalidArgument("created_after and created_before are unix seconds, not negative", field="created_after")
        start = 0
        if page_token:
            if not page_token.isdigit():
                raise InvalidArgument("page_token is not one this service gave out", field="page_token")
            start = int(page_token)
        matching = [r for r in await self._store.list_runs(namespace, session_id)
                    if (not states or r.get("state") in states)
                    and float(r.get("created_at", 0.0)) >= created_after
                    and (not created_before or float(r.get("created_at", 0.0)) < created_before)]
        limit = page_size or 50
        page = matching[start:start + limit]
        following = start + limit
        return page, str(following) if following < len(matching) else ""
