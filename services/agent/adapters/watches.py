"""Streams the agent keeps open to the tools service for as long as it runs, each telling a
cache in the agent what changed, so turns need not ask: the catalog's version (WatchCatalog →
CachedCatalog) and which sessions have background state (WatchBackground → KnownBackground).

Both share one life: reconnect after a break with a bounded backoff; while broken, the cache
knows nothing and every turn asks, as without a watch; an older tools service without the
stream (UNIMPLEMENTED) is never watched."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import grpc

from agentmesh.agent.adapters.background_sessions import KnownBackground
from agentmesh.agent.adapters.tool_catalog import CachedCatalog
from agentmesh.clients.tools import ToolsClient
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.logs import get_logger

__all__ = ["BackgroundWatch", "CatalogWatch"]

log = get_logger("agentmesh.agent")


class _ToolsWatch:
    """One reconnecting stream from the tools service; subclasses say what it is and what each
    message and a loss mean."""

    RETRY_FIRST_S = 0.1
    RETRY_MAX_S = 2.0
    name = ""
    broken_message = ""

    def __init__(self, client: ToolsClient):
        self._stub = client.stub
        self._task: asyncio.Task[None] | None = None

    def _stream(self) -> AsyncIterator[Any]:
        raise NotImplementedError

    def _apply(self, message: Any) -> None:
        raise NotImplementedError

    def _lost(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        delay = self.RETRY_FIRST_S
        while True:
            try:
                async for message in self._stream():
                    self._apply(message)
                    delay = self.RETRY_FIRST_S
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._lost()
                    return
            except Exception:
                log.warning(self.broken_message, exc_info=True)
            self._lost()  # the stream ended (the service drains) or broke
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.RETRY_MAX_S)


class CatalogWatch(_ToolsWatch):
    """Keeps a CachedCatalog told of the tools service's catalog version (WatchCatalog)."""

    name = "catalog-watch"
    broken_message = "catalog watch broke; turns list the tools until it is back"

    def __init__(self, client: ToolsClient, catalog: CachedCatalog):
        super().__init__(client)
        self._catalog = catalog

    def _stream(self) -> AsyncIterator[Any]:
        return self._stub.WatchCatalog(tools_service_pb2.WatchCatalogRequest(), wait_for_ready=True)

    def _apply(self, message: Any) -> None:
        self._catalog.version_now(message.version)

    def _lost(self) -> None:
        self._catalog.version_now(None)


class BackgroundWatch(_ToolsWatch):
    """Keeps a KnownBackground told which sessions the tools service holds background state for
    (WatchBackground). It runs on the channel the calls use, so it hears from the tools replica
    they reach."""

    name = "background-watch"
    broken_message = "background watch broke; turns ask for background results until it is back"

    def __init__(self, client: ToolsClient, known: KnownBackground):
        super().__init__(client)
        self._known = known

    def _stream(self) -> AsyncIterator[Any]:
        return self._stub.WatchBackground(tools_service_pb2.WatchBackgroundRequest(), wait_for_ready=True)

    def _apply(self, message: Any) -> None:
        if message.complete:
            self._known.complete(message.pending)
        else:
            self._known.changed(message.pending, message.cleared)

    def _lost(self) -> None:
        self._known.lost()
