"""The HTTP span of a request to a model server (`POST`, a CLIENT span under its `chat {model}`
span), and the W3C trace context the request carries to the server.

OpenTelemetry's httpx instrumentation did this before, wrapping each transport's
`handle_async_request`; per model call it cost ~0.16 ms of the agent's CPU against ~0.05 ms for
this span (docs/benchmarks.md), for attributes the agent knows anyway and a histogram
(`http.client.duration`) that no dashboard reads — `gen_ai.client.operation.duration` measures
the model call. Overriding `AsyncClient.send` rather than giving the client a transport keeps
httpx's own transports, environment proxies included.

The span carries both the older HTTP attribute names the instrumentation used by default
(`http.method`, `http.url`, `http.status_code`) and the stable ones (`http.request.method`,
`url.full`, `http.response.status_code`, `server.address`, `server.port`), so queries written
for either keep working. The URL is redacted as the instrumentation did (credentials and
signature query parameters).
"""

from __future__ import annotations

import functools
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.http import redact_url

from agentmesh.telemetry.genai import ERROR_TYPE

__all__ = ["TracedClient"]


@functools.lru_cache(maxsize=64)
def _url_attributes(url: str, host: str, port: int) -> dict[str, Any]:
    """A provider posts to one URL: redacting it once is enough."""
    redacted = redact_url(url)
    return {"http.url": redacted, "url.full": redacted, "server.address": host, "server.port": port}


class TracedClient(httpx.AsyncClient):
    """An httpx client whose every request is a CLIENT span and carries `traceparent`."""

    def __init__(self, *, tracer: trace.Tracer, **kwargs: Any):
        super().__init__(**kwargs)
        self._tracer = tracer

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        url = request.url
        attributes = {"http.method": request.method, "http.request.method": request.method,
                      **_url_attributes(str(url), url.host, url.port or (443 if url.scheme == "https" else 80))}
        with self._tracer.start_as_current_span(request.method, kind=SpanKind.CLIENT, attributes=attributes,
                                                record_exception=True, set_status_on_exception=True) as span:
            inject(request.headers)  # the span's context, so the model server's work joins the trace
            try:
                # A streamed response returns once its head is in: the span is the request's wait.
                response = await super().send(request, **kwargs)
            except Exception as exc:
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
                raise
            status = response.status_code
            span.set_attributes({"http.status_code": status, "http.response.status_code": status})
            if status >= 400:
                span.set_status(Status(StatusCode.ERROR))
                span.set_attribute(ERROR_TYPE, str(status))
            return response
