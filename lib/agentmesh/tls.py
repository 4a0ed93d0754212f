"""The CA bundles outgoing HTTPS connections verify against, each loaded once per process.

Loading a bundle into an `ssl.SSLContext` costs tens of milliseconds of CPU, and httpx does it for
every client made with `verify=True` (the default). A service makes several clients when it
starts (the model provider's, the context-window probe's, web_fetch's, the webhooks') and more
while it runs, so each start paid for the same bundle several times. These contexts are the ones
httpx and `ssl` would build, shared: a context holds no per-connection state (the clients here
all speak HTTP/1.1, the ALPN httpcore sets on it before each handshake).
"""

from __future__ import annotations

import functools
import os
import ssl

import httpx

__all__ = ["httpx_context", "system_context"]


def httpx_context(trust_env: bool = True) -> ssl.SSLContext:
    """What `httpx.create_ssl_context(trust_env=trust_env)` returns: SSL_CERT_FILE or SSL_CERT_DIR
    when `trust_env` and set, otherwise certifi's bundle. Pass it as a client's `verify`."""
    if not trust_env:
        return _httpx_context(False, "", "")
    return _httpx_context(True, os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))


@functools.cache
def _httpx_context(trust_env: bool, cert_file: str, cert_dir: str) -> ssl.SSLContext:
    # The variables are part of the key, so a process that changes them gets what httpx would give.
    return httpx.create_ssl_context(trust_env=trust_env)


@functools.cache
def system_context() -> ssl.SSLContext:
    """`ssl.create_default_context()`: the operating system's CA store."""
    return ssl.create_default_context()
