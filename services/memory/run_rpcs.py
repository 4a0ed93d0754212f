# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's run RPCs — the gateways' run records and each namespace's webhook secret
and default webhook (runs.py) — as a part of MemoryServicer (server.py) of their own: proto <->
the cores' dicts, each checked against the caller's tenants as the rest of the service's RPCs are."""

from __future__ import annotations

from google.protobuf import json_format

from agentmesh.errors import AgentmeshError, FailedPrecondition
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.memory.runs import Runs, WebhookSecrets
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import sessions_pb2

__all__ = ["RunRecordRpcs"]


class RunRecordRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _runs: Runs | None
    _webhook_secrets: WebhookSecrets | None

    # --- runs (runs.py): the gateways record their turns here ---

    def _run_records(self) -> Runs:
        if self._runs is None:
            raise FailedPrecondition("this memory service keeps no runs")
        return self._runs

    @translate_errors
    async def PutRunRecord(self, request, context):
        self._tenants.namespace(request.namespace or "default", "PutRunRecord")
        stored = await self._run_records().put(json_format.MessageToDict(request, preserving_proto_field_name=True))
        # What was stored is the request with its namespace named: answered as such, not parsed
        # back from the stored dict (a gateway writes a record a turn).
        reply = sessions_pb2.Run()
        reply.CopyFrom(request)
        reply.namespace = stored["namespace"]
        return reply

    @translate_errors
    async def PutRunRecords(self, request, context):
        runs, errors = self._run_records(), []
        for run in request.runs:
            # Each as PutRunRecord: a record refused (another tenant's namespace, a bad state) is
            # named with its sentence; the others are stored all the same.
            try:
                self._tenants.namespace(run.namespace or "default", "PutRunRecord")
                await runs.put(json_format.MessageToDict(run, preserving_proto_field_name=True))
            except AgentmeshError as exc:
                errors.append(exc.message)
            else:
                errors.append("")
        return memory_service_pb2.PutRunRecordsResponse(errors=errors)

    @translate_errors
    async def GetRunRecord(self, request, context):
        run = await self._run_records().get(request.run_id)
        # Another tenant's run is NOT_FOUND, with the sentence of a run that does not exist.
        self._tenants.namespace(str(run.get("namespace", "default")), "GetRunRecord")
        return json_format.ParseDict(run, sessions_pb2.Run(), ignore_unknown_fields=True)

    @translate_errors
    async def ListRunRecords(self, request, context):
        if request.webhook_pending:
            # Every namespace's: only a gateway asks (CALLERS), to resume the deliveries — and a
            # call made for a user sees their namespaces' only.
            visible = self._tenants.visible_namespaces()
            runs = [r for r in await self._run_records().pending_webhooks()
                    if visible is None or r.get("namespace", "default") in visible]
            return sessions_pb2.ListRunRecordsResponse(
                runs=[json_format.ParseDict(r, sessions_pb2.Run(), ignore_unknown_fields=True) for r in runs])
        self._tenants.namespace(request.namespace or "default", "ListRunRecords")
        runs, token = await self._run_records().list(
            request.namespace, request.session_id, list(request.states), request.created_after,
            request.created_before, request.page_size, request.page_token)
        return sessions_pb2.ListRunRecordsResponse(
            runs=[json_format.ParseDict(r, sessions_pb2.Run(), ignore_unknown_fields=True) for r in runs],
            next_page_token=token)

    def _webhooks(self, namespace: str, rpc: str, what: str = "webhooks"):
        """The namespace's webhook store, once the caller may call `rpc` on the namespace."""
        self._tenants.namespace(namespace or "default", rpc)
        if self._webhook_secrets is None:
            raise FailedPrecondition(f"this memory service keeps no {what}")
        return self._webhook_secrets

    @translate_errors
    async def GetWebhookSecret(self, request, context):
        secret = await self._webhooks(request.namespace, "GetWebhookSecret", "webhook secrets").get(request.namespace)
        return sessions_pb2.WebhookSecret(namespace=request.namespace or "default", secret=secret)

    @translate_errors
    async def GetNamespaceWebhook(self, request, context):
        url = await self._webhooks(request.namespace, "GetNamespaceWebhook").default_url(request.namespace)
        return sessions_pb2.NamespaceWebhook(namespace=request.namespace or "default", default_url=url)

    @translate_errors
    async def SetNamespaceWebhook(self, request, context):
        webhooks = self._webhooks(request.namespace, "SetNamespaceWebhook")
        url = await webhooks.set_default_url(request.namespace, request.default_url)
        return sessions_pb2.NamespaceWebhook(namespace=request.namespace or "default", default_url=url)
