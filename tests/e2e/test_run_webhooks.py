"""Run webhooks against the real stack (docs/api.md, "Webhooks"): a run that names a webhook URL
has its record POSTed there when it ends, signed the Standard Webhooks way with its namespace's
secret, retried after a failed attempt — the receiver (aiohttp on loopback, which the deployment
setting allows here) processes exactly one verified delivery; a tampered body does not verify; a
private address is refused at creation where the setting is off."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json

import grpc
import pytest
from aiohttp import web

from agentmesh.rpc.errors import error_info_of
from agentmesh.rpc.launch import start_service
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.support.llm_server import reply
from tests.support.stack import Stack

ALLOW_LOOPBACK = {"AGENTMESH_GATEWAY_WEBHOOK_ALLOW_PRIVATE": "1", "AGENTMESH_GATEWAY_WEBHOOK_RETRY_BASE_S": "0.2"}


def verify(secret: str, headers, body: bytes) -> bool:
    """What a receiver does (the snippet in docs/api.md)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, sig.partition(",")[2]) for sig in headers["webhook-signature"].split())


class Receiver:
    """Answers the first POST with 500, then 200; keeps every request it got."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.processed: dict[str, bytes] = {}  # by webhook-id: what an idempotent receiver keeps
        self.secret = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append((headers, body))
        if len(self.requests) == 1:
            return web.Response(status=500, text="not now")
        if not verify(self.secret, headers, body):
            return web.Response(status=400, text="bad signature")
        self.processed.setdefault(headers["webhook-id"], body)
        return web.Response(status=204)


@pytest.fixture
async def receiver():
    hooks = Receiver()
    app = web.Application()

    async def route(request: web.Request) -> web.Response:
        return await hooks.handle(request)  # looked up per request: a test may swap it

    app.router.add_post("/hook", route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hooks.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # noqa: SLF001 - the port it took
    yield hooks
    await runner.cleanup()


async def test_a_run_webhook_is_delivered_once_verified_despite_a_failed_first_attempt(tmp_path, llm, receiver):
    llm.add(reply("Done, hooked."))
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=ALLOW_LOOPBACK) as stack:
        gateway = stack.gateway_stub()
        secret = await gateway.GetWebhookSecret(sessions_pb2.GetWebhookSecretRequest(namespace="default"), timeout=10)
        assert secret.secret.startswith("whsec_")
        receiver.secret = secret.secret

        run = await gateway.CreateRun(gateway_pb2.CreateRunRequest(session_id="hooked", message="go",
                                                                   webhook_url=receiver.url), timeout=10)
        async with asyncio.timeout(60):
            while True:
                got = await gateway.GetRun(gateway_pb2.GetRunRequest(run_id=run.run_id), timeout=10)
                if got.webhook_state == "delivered":
                    break
                await asyncio.sleep(0.1)

    assert [a.status_code for a in got.webhook_attempts] == [500, 204]
    assert list(receiver.processed) == [run.run_id]
    assert len(receiver.requests) == 2 and {h["webhook-id"] for h, _ in receiver.requests} == {run.run_id}
    headers, body = receiver.requests[1]
    delivered = json.loads(body)
    assert delivered["run_id"] == run.run_id and delivered["state"] == "succeeded"
    assert delivered["stop_reason"] == "completed" and "webhook_attempts" not in delivered
    # A body changed on the way does not verify.
    tampered = body.replace(b"succeeded", b"failed")
    assert verify(receiver.secret, headers, body) and not verify(receiver.secret, headers, tampered)


async def test_a_private_webhook_url_is_refused_at_creation_when_the_deployment_does_not_allow_it(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
        gateway = stack.gateway_stub()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gateway.CreateRun(gateway_pb2.CreateRunRequest(
                session_id="private", message="go", webhook_url="http://127.0.0.1:9/hook"), timeout=10)
        err = info.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == ("webhook_url refused: 127.0.0.1 resolves to 127.0.0.1, which is not a public internet "
                                 "address; a run's webhook does not reach loopback, link-local or private networks")
        assert error_info_of(err).reason == "URL_REFUSED"
        # Nothing was started or recorded.
        listing = await gateway.ListRuns(gateway_pb2.ListTurnRunsRequest(), timeout=10)
        assert not listing.runs and not llm.requests


async def test_a_pending_delivery_survives_a_gateway_restart(tmp_path, llm, receiver):
    llm.add(reply("Done before the restart."))
    receiver.failing = True  # answered 500 until the gateway has been restarted

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        receiver.requests.append((headers, body))
        if receiver.failing:
            return web.Response(status=500)
        if verify(receiver.secret, headers, body):
            receiver.processed.setdefault(headers["webhook-id"], body)
            return web.Response(status=200)
        return web.Response(status=400)

    receiver.handle = handle  # the fixture's route calls the receiver's handle at request time
    slow_retries = {**ALLOW_LOOPBACK, "AGENTMESH_GATEWAY_WEBHOOK_RETRY_BASE_S": "1"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=slow_retries) as stack:
        gateway = stack.gateway_stub()
        receiver.secret = (await gateway.GetWebhookSecret(sessions_pb2.GetWebhookSecretRequest(), timeout=10)).secret
        run = await gateway.CreateRun(gateway_pb2.CreateRunRequest(session_id="restarted", message="go",
                                                                   webhook_url=receiver.url), timeout=10)
        async with asyncio.timeout(60):
            while not receiver.requests:
                await asyncio.sleep(0.05)
        # The gateway goes away with the delivery pending, and comes back; the receiver recovers.
        host = stack.hosts.pop("gateway")
        await host.stop(grace=1)
        host.telemetry.shutdown()
        receiver.failing = False
        stack.hosts["gateway"] = await start_service("gateway", stack.settings, stack.addresses["gateway"])
        gateway = stack.gateway_stub()
        async with asyncio.timeout(60):
            while (await gateway.GetRun(gateway_pb2.GetRunRequest(run_id=run.run_id), timeout=10)).webhook_state != "delivered":
                await asyncio.sleep(0.1)
    assert list(receiver.processed) == [run.run_id]
    assert all(h["webhook-id"] == run.run_id for h, _ in receiver.requests)


async def test_a_namespace_default_webhook_reports_the_runs_that_name_none(tmp_path, llm, receiver):
    llm.add(reply("Chatted."))
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=ALLOW_LOOPBACK) as stack:
        gateway = stack.gateway_stub()
        receiver.secret = (await gateway.GetWebhookSecret(sessions_pb2.GetWebhookSecretRequest(), timeout=10)).secret
        stored = await gateway.SetNamespaceWebhook(sessions_pb2.NamespaceWebhook(default_url=receiver.url), timeout=10)
        assert stored.namespace == "default" and stored.default_url == receiver.url
        got = await gateway.GetNamespaceWebhook(sessions_pb2.GetNamespaceWebhookRequest(), timeout=10)
        assert got.default_url == receiver.url

        # A plain Chat turn is a run too: it is reported to the namespace's webhook.
        events = [e async for e in gateway.Chat(gateway_pb2.ChatRequest(session_id="plain", message="hi"), timeout=30)]
        run_id = events[-1].run_id
        async with asyncio.timeout(60):
            while (await gateway.GetRun(gateway_pb2.GetRunRequest(run_id=run_id), timeout=10)).webhook_state != "delivered":
                await asyncio.sleep(0.1)
        assert list(receiver.processed) == [run_id]

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gateway.SetNamespaceWebhook(sessions_pb2.NamespaceWebhook(default_url="ftp://example.com"), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not an http:// or https:// URL" in info.value.details()
        assert (await gateway.GetNamespaceWebhook(sessions_pb2.GetNamespaceWebhookRequest(), timeout=10)).default_url == receiver.url
