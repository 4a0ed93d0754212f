"""What every model provider shares: the port the loop calls, retries, and error wording.

A provider is an object with `name` (reported as gen_ai.provider.name) and
`stream(request) -> AsyncIterator[ModelEvent]`: zero or more `TextChunk` / `Retrying` items,
then exactly one `ModelReply`. Failures raise `agentmesh.errors` exceptions whose message names
the URL and never contains the API key.

Retries happen only before the first byte of an answer is read: a 429, a 5xx, a connection
error or a timeout while waiting for the response head is retried with jittered exponential
backoff (honouring Retry-After); once the stream has begun, a failure ends the call, because
the loop may already have shown part of the answer and a retry could answer differently.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol, TypeVar

import httpx

from agentmesh.agent.types import ModelEvent, ModelRequest, Retrying
from agentmesh.errors import (
    AgentmeshError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

# Statuses that mean "try again later" rather than "your request is wrong".
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
_DETAIL_CHARS = 300


class ModelProvider(Protocol):
    name: str

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4
    base_s: float = 0.5
    max_s: float = 20.0
    retry_after_max_s: float = 60.0

    def after_s(self, asked_s: float) -> float:
        """The delay for a server's Retry-After: what it asked, plus up to a quarter more (at most
        2 s) — never sooner, but not every waiting call in step: a server that answered a burst
        with 429 and `Retry-After: 1` would get the whole burst back in the same instant."""
        return asked_s + random.uniform(0.0, min(asked_s / 4, 2.0))

    def backoff_s(self, attempt: int) -> float:
        """Delay before retry number `attempt` (from 1): exponential, capped, with full jitter
        over its upper half so that many agents hitting one server do not retry in step."""
        ceiling = min(self.max_s, self.base_s * (2 ** (attempt - 1)))
        return ceiling * random.uniform(0.5, 1.0)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds a server asked us to wait: `retry-after-ms`, `Retry-After` seconds or HTTP date."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Redactor:
    """Masks the API key in any text that might reach an error message or a log line
    (some servers echo the key they rejected)."""

    def __init__(self, secret: str):
        self._secret = secret

    def __call__(self, text: str) -> str:
        if self._secret and len(self._secret) >= 4:
            text = text.replace(self._secret, "[redacted]")
        return text


def error_detail(body: bytes, redact: Redactor) -> str:
    """The server's own explanation from an error body, short and without the key."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            text = str(err.get("message") or err.get("detail") or err.get("type") or text)
        elif isinstance(err, str):
            text = err
    text = " ".join(text.split())
    if len(text) > _DETAIL_CHARS:
        text = text[:_DETAIL_CHARS] + "…"
    return redact(text)


def describe_exception(exc: BaseException, redact: Redactor) -> str:
    if isinstance(exc, httpx.TimeoutException):
        kind = {
            httpx.ConnectTimeout: "connecting timed out",
            httpx.ReadTimeout: "no answer within the read timeout",
            httpx.WriteTimeout: "sending the request timed out",
            httpx.PoolTimeout: "no free connection in time",
        }.get(type(exc), "timed out")
        return kind
    text = str(exc) or type(exc).__name__
    return redact(text)


def status_error(status: int, url: str, detail: str, attempts: int) -> AgentmeshError:
    said = f": {detail}" if detail else ""
    if status == 401:
        return Unauthenticated(f"the model server at {url} refused the API key (HTTP 401){said}; check AGENTMESH_LLM_API_KEY")
    if status == 403:
        return PermissionDenied(f"the model server at {url} denied access (HTTP 403){said}")
    if status == 404:
        return NotFound(
            f"the model server at {url} answered HTTP 404{said}; check AGENTMESH_LLM_BASE_URL and AGENTMESH_LLM_MODEL"
        )
    if status == 429:
        return ResourceExhausted(f"the model server at {url} is rate limiting (HTTP 429) after {attempts} attempts{said}")
    if status in RETRY_STATUSES or status >= 500:
        return Unavailable(f"the model server at {url} answered HTTP {status} after {attempts} attempts{said}")
    return InvalidArgument(f"the model server at {url} rejected the request (HTTP {status}){said}")


class HttpStreamOpener:
    """Opens a streamed POST, retrying until the response head says 2xx.

    `open()` yields `Retrying` notes while it backs off, then the open `httpx.Response`
    (the caller reads and closes it). Everything after that is the caller's: no retries.
    """

    def __init__(self, client: httpx.AsyncClient, retry: RetryPolicy, redact: Redactor):
        self._client = client
        self._retry = retry
        self._redact = redact

    async def open(self, url: str, headers: dict[str, str],
                   body: dict[str, Any] | bytes) -> AsyncIterator[Retrying | httpx.Response]:
        """`body`: the JSON to post, as an object or already encoded."""
        attempts = self._retry.max_retries + 1
        if isinstance(body, bytes):
            headers = {**headers, "Content-Type": "application/json"}
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            try:
                if isinstance(body, bytes):
                    request = self._client.build_request("POST", url, headers=headers, content=body)
                else:
                    request = self._client.build_request("POST", url, headers=headers, json=body)
                response = await self._client.send(request, stream=True)
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                # A configuration mistake: retrying cannot help.
                raise FailedPrecondition(
                    f"the model URL {url} is not usable ({self._redact(str(exc))}); check AGENTMESH_LLM_BASE_URL"
                ) from None
            except httpx.TimeoutException as exc:
                reason = describe_exception(exc, self._redact)
                if attempt == attempts:
                    raise DeadlineExceeded(f"the model server at {url} did not answer ({reason}) after {attempts} attempts") from None
            except (httpx.TransportError, OSError) as exc:
                reason = describe_exception(exc, self._redact)
                if attempt == attempts:
                    raise Unavailable(f"the model server at {url} could not be reached after {attempts} attempts: {reason}") from None
            else:
                if response.status_code < 300:
                    yield response
                    return
                try:
                    detail = error_detail(await response.aread(), self._redact)
                except httpx.HTTPError:
                    detail = ""
                finally:
                    await response.aclose()
                status = response.status_code
                if status not in RETRY_STATUSES or attempt == attempts:
                    raise status_error(status, url, detail, attempt)
                reason = f"HTTP {status}"
                wait = retry_after_s(response.headers)
                if wait is not None and wait > self._retry.retry_after_max_s:
                    raise ResourceExhausted(
                        f"the model server at {url} asked to retry after {wait:.0f}s (HTTP {status}), longer than "
                        f"the {self._retry.retry_after_max_s:.0f}s the agent waits{': ' + detail if detail else ''}"
                    )
            delay = self._retry.after_s(wait) if wait is not None else self._retry.backoff_s(attempt)
            yield Retrying(attempt=attempt, max_attempts=attempts, delay_s=delay, reason=reason)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


def check_stream_type(response: httpx.Response, url: str, *, json_ok: bool) -> None:
    """A 2xx that is not an event stream (an HTML page, a proxy's login form) means the URL
    points somewhere else than a model API: say so instead of failing to parse it."""
    content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if content_type == "text/event-stream" or (json_ok and content_type.endswith("json")):
        return
    raise FailedPrecondition(
        f"the server at {url} answered with {content_type or 'no content type'}, not an event stream; "
        "check AGENTMESH_LLM_BASE_URL and AGENTMESH_LLM_PROVIDER"
    )


def broken_stream_error(url: str, exc: BaseException, redact: Redactor) -> Unavailable:
    return Unavailable(
        f"the model server at {url} broke off its answer ({describe_exception(exc, redact)}); "
        "not retried because part of the answer had already arrived"
    )


async def drain(events: AsyncIterator[Any], limit_s: float = 2.0) -> None:
    """Read what is left of a finished stream (the chunked terminator) so that httpx can put the
    connection back in its pool; closing a half-read response would close the connection and
    cost a new TCP (and TLS) handshake on the next call."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(limit_s):
            async for _ in events:
                pass


_Item = TypeVar("_Item")


@contextlib.asynccontextmanager
async def closing(events: AsyncIterator[_Item]) -> AsyncIterator[AsyncIterator[_Item]]:
    """`events` (a provider's stream), closed on leaving the block — not whenever it is
    collected: a wrapper that stops early must end its inner stream's HTTP response at once."""
    try:
        yield events
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


def build_timeout(read_s: float, connect_s: float) -> httpx.Timeout:
    return httpx.Timeout(read_s, connect=min(connect_s, read_s))
