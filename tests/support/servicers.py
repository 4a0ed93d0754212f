"""A servicer of the tests' own (e.g. a service as an older version was) on a real port."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Callable

import grpc


@contextlib.asynccontextmanager
async def served(add_to_server: Callable[[Any, grpc.aio.Server], None],
                 servicer: Any) -> AsyncIterator[tuple[grpc.aio.Channel, str]]:
    """`servicer`, added with its generated `add_..._to_server`, on a plain grpc.aio server on a
    free loopback port; yields a plain channel to it and its address."""
    server = grpc.aio.server()
    add_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    channel = grpc.aio.insecure_channel(address)
    try:
        yield channel, address
    finally:
        await channel.close()
        await server.stop(0)
