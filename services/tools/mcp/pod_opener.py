"""A stdio MCP server as a long-lived pod (AGENTMESH_SANDBOX=kubernetes), reached over its
container's stdin and stdout through the API server's `pods/attach`.

Each opening creates the server's pod (pod_spec.py), follows it until its container runs, attaches
(a websocket speaking the v5/v4 channel protocol, through the `kubernetes` client's stream module)
and carries MCP's newline-delimited JSON-RPC over the attached streams; leaving it deletes the pod.
The supervisor in connection.py decides when: at start, after a death (with backoff), after idling,
at shutdown. Nothing of the server ever runs in the tools service's process.

Why attach rather than a Service the server listens on: stdio servers only speak stdio; attach
keeps them unmodified, needs no port, no Service and no ingress rule into the sandbox (the
connection runs through the API server and the kubelet, both already trusted), and the server's
life is the container's, so a dead server is a closed stream and a terminated pod to read why.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import mcp.types as mcp_types
from kubernetes.stream import ws_client
from mcp.shared.message import SessionMessage
from websocket import WebSocketConnectionClosedException

from agentmesh.logs import get_logger
from agentmesh.tools.mcp.config import McpServerEntry
from agentmesh.tools.mcp.connection import Opener, ServerUnavailable
from agentmesh.tools.mcp.pod_spec import CONTAINER, LABEL_MCP_POD, build_server_pod, pod_name
from agentmesh.tools.sandbox.k8s_api import KubeApiError, KubernetesJobs
from agentmesh.tools.sandbox.k8s_watch import CONFIG_FAILURES, IMAGE_PULL_FINAL
from agentmesh.tools.settings import KubernetesSandbox

log = get_logger("agentmesh.tools.mcp")

# stdin goes out in frames of at most this size (API servers bound a frame's size).
STDIN_FRAME_BYTES = 32 * 1024
WATCH_WINDOW_S = 30
# How long the pump waits for a frame before looking whether the stream was closed under it.
PUMP_POLL_S = 0.5


class PodFailed(ServerUnavailable):
    """The server's pod could not run it. `configuration` when that is the entry's (or the
    deployment's) fault — an image that cannot be pulled, a command the image lacks, a server that
    exits at once, an API that refuses the service — rather than the cluster's state right now."""

    def __init__(self, message: str, configuration: bool):
        super().__init__(message)
        self.configuration = configuration


class PodProgress:
    """From the server pod's states to "running", a failure, or nothing yet (pure logic)."""

    def __init__(self, server: str, start_timeout_s: float):
        self.server = server
        self.start_timeout_s = start_timeout_s
        self.waiting = ""
        self.unschedulable = ""

    def on_pod(self, pod: dict[str, Any]) -> bool:
        """True once the container runs; PodFailed when it never will."""
        status = pod.get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled":
                unschedulable = condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
                self.unschedulable = (condition.get("message") or "no node can run it") if unschedulable else ""
        container = next((c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER), None)
        state = (container or {}).get("state") or {}
        if "running" in state:
            return True
        if "terminated" in state:
            raise PodFailed(f"MCP server {self.server!r}: its pod's container ended before the server could be "
                            f"reached ({describe_termination(state['terminated'])})", configuration=True)
        if "waiting" in state:
            waiting = state["waiting"] or {}
            reason, message = waiting.get("reason", ""), waiting.get("message", "")
            self.waiting = f"{reason}: {message}" if message else reason
            if reason in IMAGE_PULL_FINAL:
                raise PodFailed(f"MCP server {self.server!r}: its image could not be pulled ({reason}): "
                                f"{message or 'no detail from the kubelet'}", configuration=True)
            if reason in CONFIG_FAILURES:
                raise PodFailed(f"MCP server {self.server!r}: its container could not start ({reason}): {message}",
                                configuration=True)
        if status.get("phase") in ("Failed", "Succeeded"):
            raise PodFailed(f"MCP server {self.server!r}: its pod ended before it ran ({status.get('reason', '')} "
                            f"{status.get('message', '')})".strip(), configuration=False)
        return False

    def timed_out(self) -> PodFailed:
        if self.unschedulable:
            return PodFailed(f"MCP server {self.server!r}: no node could run its pod within {self.start_timeout_s:g} s: "
                             f"{self.unschedulable}", configuration=False)
        last = f" (last state: {self.waiting})" if self.waiting else ""
        return PodFailed(f"MCP server {self.server!r}: its pod did not start within {self.start_timeout_s:g} s{last}",
                         configuration=False)


def describe_termination(terminated: dict[str, Any]) -> str:
    words = f"exit code {terminated.get('exitCode', '?')}"
    if terminated.get("reason"):
        words += f", {terminated['reason']}"
    message = (terminated.get("message") or "").strip()
    return f"{words}: {message[-600:]}" if message else words


def api_refusal(server: str, namespace: str, exc: KubeApiError) -> PodFailed:
    if exc.status in (401, 403):
        return PodFailed(f"MCP server {server!r}: the Kubernetes API refused the tools service ({exc.status}): {exc.message}. "
                         f"Its service account needs create/get/list/watch/delete on pods and create/get on pods/attach "
                         f"in namespace {namespace}", configuration=True)
    if exc.status == 422:
        return PodFailed(f"MCP server {server!r}: Kubernetes refused its pod: {exc.message}", configuration=True)
    return PodFailed(f"MCP server {server!r}: the Kubernetes API failed ({exc.status}): {exc.message}", configuration=False)


class PodServer:
    """One server entry's pods: each opening is a fresh pod. Remembers why the last one failed."""

    def __init__(self, entry: McpServerEntry, api: KubernetesJobs, cfg: KubernetesSandbox, identity: tuple[int, int],
                 owner: str, namespace: str, errlog: TextIO):
        self.entry = entry
        self._api = api
        self._cfg = cfg
        self._identity = identity
        self._owner = owner
        self._namespace = namespace
        self._errlog = errlog
        self.failure: PodFailed | None = None
        self.pod = ""

    @property
    def opener(self) -> Opener:
        return self.open

    @asynccontextmanager
    async def open(self) -> AsyncIterator[tuple[Any, Any]]:
        name = pod_name(self.entry.name)
        body = build_server_pod(self.entry, self._cfg, name, self._identity, self._owner, self._namespace)
        try:
            try:
                try:
                    await self._api.create_pod(body)
                    self.pod = name
                    await self._until_running(name)
                except KubeApiError as exc:
                    raise api_refusal(self.entry.name, self._cfg.namespace, exc) from None
                socket = await self._attach(name)
            except PodFailed as exc:
                self.failure = exc
                raise
            self.failure = None
            log.info("MCP server pod attached", server=self.entry.name, pod=name, namespace=self._namespace)
            bridge = AttachedStreams(socket, self._errlog)
            try:
                async with bridge.streams() as streams:
                    yield streams
            except Exception as exc:
                if not bridge.ended:
                    raise
                ended = await self._termination(name)
                if ended and not bridge.heard_from_server:
                    # It never said a word: it cannot run as configured (arguments, a missing module, ...).
                    self.failure = PodFailed(f"MCP server {self.entry.name!r}: its pod's container ended before the "
                                             f"server answered ({ended})", configuration=True)
                    raise self.failure from exc
                raise ServerUnavailable(f"MCP server {self.entry.name!r}: " + (
                    f"its pod's container ended ({ended})" if ended else "the attached stream to its pod closed")) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await self._delete(name)

    async def _until_running(self, name: str) -> None:
        progress = PodProgress(self.entry.name, self._cfg.start_timeout_s)
        selector = f"{LABEL_MCP_POD}={name}"
        deadline = time.monotonic() + self._cfg.start_timeout_s
        try:
            async with asyncio.timeout(self._cfg.start_timeout_s):
                while True:
                    pods, version = await self._api.list_pods(selector)
                    if not pods:
                        raise PodFailed(f"MCP server {self.entry.name!r}: its pod {name} was deleted before it started",
                                        configuration=False)
                    if any(progress.on_pod(pod) for pod in pods):
                        return
                    window = max(int(deadline - time.monotonic()), 1)
                    async for event, pod in self._api.watch_pods(selector, version, min(window, WATCH_WINDOW_S)):
                        if event == "DELETED":
                            raise PodFailed(f"MCP server {self.entry.name!r}: its pod {name} was deleted before it started",
                                            configuration=False)
                        if event in ("ADDED", "MODIFIED") and progress.on_pod(pod):
                            return
        except TimeoutError:
            raise progress.timed_out() from None

    async def _attach(self, name: str) -> ws_client.WSClient:
        try:
            return await self._api.attach(name, CONTAINER)
        except KubeApiError as exc:
            # Attaching to a container that has just ended fails; say why it ended instead.
            ended = await self._termination(name)
            if ended:
                raise PodFailed(f"MCP server {self.entry.name!r}: its pod's container ended before the server could be "
                                f"reached ({ended})", configuration=True) from None
            raise api_refusal(self.entry.name, self._cfg.namespace, exc) from None

    async def _termination(self, name: str, patience_s: float = 3.0) -> str:
        """How the pod's container ended ("" if it has not): the kubelet reports it a moment after
        the stream closes, so ask a few times."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                pod = await self._api.get_pod(name)
            except Exception:  # noqa: BLE001 - only for the message
                return ""
            statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
            state = (statuses[0].get("state") or {}) if statuses else {}
            if "terminated" in state:
                return describe_termination(state["terminated"])
            if pod is None or time.monotonic() > deadline:
                return ""
            await asyncio.sleep(0.2)

    async def _delete(self, name: str) -> None:
        if not self.pod:
            return
        try:
            await asyncio.wait_for(self._api.delete_pod(name), 30)
        except Exception as exc:  # noqa: BLE001 - the next tools service start removes leftovers; say so
            log.warning("could not delete an MCP server pod", server=self.entry.name, pod=name, error=str(exc))
        finally:
            self.pod = ""


class AttachedStreams:
    """MCP's stdio framing (one JSON-RPC message a line) over an attached websocket.

    The websocket client is synchronous: one thread of its own reads frames (stdout to the session,
    stderr to the server's log file); writes go from the event loop through a worker thread.
    """

    def __init__(self, socket: ws_client.WSClient, errlog: TextIO):
        self._socket: Any = socket  # the client library is untyped
        self._errlog = errlog
        self.ended = False  # the stream closed from the far end (the container ended), not by us
        self.heard_from_server = False  # anything on its stdout

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[tuple[Any, Any]]:
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        closing = threading.Event()
        pump = threading.Thread(target=self._pump, args=(loop, chunks, closing), name="mcp-attach", daemon=True)
        pump.start()

        async def read_stdout() -> None:
            buffer = b""
            async with read_writer:
                while (chunk := await chunks.get()) is not None:
                    *lines, buffer = (buffer + chunk).split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            await read_writer.send(_parse_line(line))
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            return

        async def write_stdin() -> None:
            try:
                async with write_reader:
                    async for message in write_reader:
                        data = (message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
                        for start in range(0, len(data), STDIN_FRAME_BYTES):
                            await asyncio.to_thread(self._socket.write_stdin, data[start:start + STDIN_FRAME_BYTES])
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError, WebSocketConnectionClosedException):
                await read_writer.aclose()  # the session sees the connection end

        async with anyio.create_task_group() as group:
            group.start_soon(read_stdout)
            group.start_soon(write_stdin)
            try:
                yield read_stream, write_stream
            finally:
                closing.set()
                with anyio.CancelScope(shield=True):
                    await asyncio.to_thread(self._close)
                group.cancel_scope.cancel()
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()

    def _pump(self, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes | None], closing: threading.Event) -> None:
        socket: Any = self._socket
        try:
            while socket.is_open() and not closing.is_set():
                socket.update(timeout=PUMP_POLL_S)
                self._drain(loop, chunks)
            self._drain(loop, chunks)
        except Exception as exc:  # noqa: BLE001 - a broken socket ends the stream like a closed one
            if not closing.is_set():
                log.info("MCP attach stream broke", error=str(exc))
        finally:
            self.ended = not closing.is_set()
            loop.call_soon_threadsafe(chunks.put_nowait, None)

    def _drain(self, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes | None]) -> None:
        stdout = self._socket.read_channel(ws_client.STDOUT_CHANNEL, timeout=0)
        if stdout:
            self.heard_from_server = True
            loop.call_soon_threadsafe(chunks.put_nowait, bytes(stdout))
        stderr = self._socket.read_channel(ws_client.STDERR_CHANNEL, timeout=0)
        if stderr:
            try:
                self._errlog.write(bytes(stderr).decode("utf-8", errors="replace"))
                self._errlog.flush()
            except (OSError, ValueError):
                pass

    def _close(self) -> None:
        try:
            # v5: tell the server its input ended (it exits on end of input), then hang up.
            self._socket.close_channel(ws_client.STDIN_CHANNEL)
        except Exception:  # noqa: BLE001 - the pod is deleted next anyway
            pass
        try:
            self._socket.close()
        except Exception:  # noqa: BLE001 - a socket the pod's end already closed: nothing is left to close
            pass


def _parse_line(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc
