"""`web_fetch`: the one tool with network. Fetches a URL over httpx and returns readable text.

Server-side request forgery is the risk: a model asked to "fetch" the cloud metadata service or
a database on the cluster network. Every connection goes through `GuardedBackend`
(agentmesh.egress, shared with the gateway's run webhooks), which resolves the host itself, refuses when any resolved address is not globally routable (loopback,
link-local, private, shared, reserved, multicast) unless configured, and then connects to the
address it checked — so a DNS answer that changes between check and connect (rebinding) cannot
slip through. Redirects are followed by hand, at most `max_redirects`, each one checked again.
Environment proxies are ignored (a proxy would connect on our behalf, past the check).

HTML becomes text with BeautifulSoup (MIT, maintained since 2004, pure Python with the stdlib
parser): forgiving of broken markup and enough to drop scripts, styles and navigation chrome.
Main-content extractors (trafilatura, readability) do better on articles but pull in lxml and
heuristics that can drop the part a model asked for; plain text of the whole page is predictable.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urljoin

import httpx
from bs4 import BeautifulSoup
from opentelemetry import trace

from agentmesh.egress import AddressPolicy, AddressRefused, guarded_transport
from agentmesh.tls import httpx_context
from agentmesh.tools.catalog import CallContext, Tool, ToolSpec, integer, obj
from agentmesh.tools.results import ToolFailure, ToolOutcome
from agentmesh.tools.settings import WebFetchSettings

USER_AGENT = "agentmesh-web-fetch/0.1 (+https://github.com/agentmesh)"
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml", "application/javascript")
DROPPED_TAGS = ("script", "style", "noscript", "svg", "template", "iframe", "canvas", "nav", "footer", "form")


def html_to_text(html: str) -> tuple[str, str]:
    soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(DROPPED_TAGS):
        tag.decompose()
    body = soup.body or soup
    lines = [line.strip() for line in body.get_text("\n").splitlines()]
    text = "\n".join(line for line in lines if line)
    return title, text


class WebTools:
    def __init__(self, settings: WebFetchSettings, policy: AddressPolicy, tracer: trace.Tracer | None = None):
        self._settings = settings
        self._policy = policy
        self._tracer = tracer or trace.NoOpTracerProvider().get_tracer(__name__)
        self._ssl_context = httpx_context(trust_env=False)

    def tools(self) -> list[Tool]:
        return [
            Tool(
                ToolSpec(
                    "web_fetch",
                    "Fetch a public http(s) URL and return its readable text (HTML is converted to text). "
                    f"At most {self._settings.max_bytes} bytes are downloaded.",
                    obj(
                        {
                            "url": {"type": "string", "description": "An http:// or https:// URL.", "maxLength": 2048, "pattern": "^[hH][tT][tT][pP][sS]?://"},
                            "max_chars": integer("Most characters of text to return. Default 20000.", 100, self._settings.max_output_chars),
                        },
                        ["url"],
                    ), read_only=True),
                self.web_fetch,
            )
        ]

    async def web_fetch(self, ctx: CallContext, args: dict[str, Any]) -> ToolOutcome:
        started = time.monotonic()
        timeout = self._settings.timeout_s
        if ctx.caller_timeout_s:
            timeout = min(timeout, ctx.caller_timeout_s)
        # A span of our own rather than httpx instrumentation: that would send `traceparent` to
        # every site a model fetches, and our trace ids are nobody else's business.
        with self._tracer.start_as_current_span("web_fetch", attributes={"url.scheme": args["url"].split(":", 1)[0].lower()}) as span:
            try:
                async with asyncio.timeout(timeout):
                    outcome = await self._fetch(args["url"], args.get("max_chars", 20_000), started)
            except TimeoutError:
                raise ToolFailure("timeout", f"fetching {args['url']} took longer than {timeout:g} s") from None
            except ToolFailure as failure:
                span.set_attribute("error.type", failure.kind)
                raise
            span.set_attribute("http.response.status_code", outcome.data.get("status", 0))
            span.set_attribute("server.address", httpx.URL(outcome.data.get("url", args["url"])).host)
            return outcome

    async def _fetch(self, url: str, max_chars: int, started: float) -> ToolOutcome:
        headers = {"User-Agent": USER_AGENT, "Accept": "text/html,text/plain,application/json;q=0.9,*/*;q=0.5"}
        async with httpx.AsyncClient(transport=guarded_transport(self._policy, self._ssl_context), follow_redirects=False, trust_env=False, headers=headers) as client:
            for _hop in range(self._settings.max_redirects + 1):
                _check_url(url)
                try:
                    async with client.stream("GET", url) as response:
                        if response.is_redirect and "location" in response.headers:
                            url = urljoin(url, response.headers["location"])
                            continue
                        body, cut = await _read_capped(response, self._settings.max_bytes)
                        return self._outcome(url, response, body, cut, max_chars, started)
                except AddressRefused as exc:
                    raise ToolFailure("address_refused", str(exc)) from None
                except httpx.ConnectError as exc:
                    cause = exc.__cause__ or exc.__context__
                    if isinstance(cause, AddressRefused):
                        raise ToolFailure("address_refused", str(cause)) from None
                    raise ToolFailure("network_error", f"could not connect to {url}: {exc}") from None
                except httpx.HTTPError as exc:
                    raise ToolFailure("network_error", f"fetching {url} failed: {type(exc).__name__}: {exc}") from None
        raise ToolFailure("too_many_redirects", f"more than {self._settings.max_redirects} redirects; stopped at {url}")

    def _outcome(self, url: str, response: httpx.Response, body: bytes, cut: bool, max_chars: int, started: float) -> ToolOutcome:
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        data = {"url": url, "status": response.status_code, "content_type": content_type, "bytes": len(body)}
        if content_type and not content_type.startswith(TEXT_TYPES):
            raise ToolFailure("unsupported_content", f"{url} is {content_type} ({len(body)} bytes), not text; web_fetch returns text only", data)
        text = body.decode(response.encoding or "utf-8", errors="replace")
        title = ""
        if content_type in ("text/html", "application/xhtml+xml") or (not content_type and "<html" in text[:1000].lower()):
            title, text = html_to_text(text)
        truncated = cut or len(text) > max_chars
        if len(text) > max_chars:
            text = text[:max_chars] + f"\n[... text truncated at {max_chars} characters ...]"
        elif cut:
            text += f"\n[... download stopped at {self._settings.max_bytes} bytes ...]"
        header = f"URL: {url}\nStatus: {response.status_code}\n" + (f"Title: {title}\n" if title else "")
        data["title"] = title
        outcome = ToolOutcome(output=header + "\n" + text, truncated=truncated, data=data, duration_ms=(time.monotonic() - started) * 1000)
        if response.status_code >= 400:
            outcome.is_error = True
            outcome.error_kind = "http_error"
        return outcome


def _check_url(url: str) -> None:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ToolFailure("invalid_arguments", f"{url!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ToolFailure("invalid_arguments", f"{url!r}: only http:// and https:// URLs with a host can be fetched")


async def _read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            return b"".join(chunks)[:limit], True
    return b"".join(chunks), False
