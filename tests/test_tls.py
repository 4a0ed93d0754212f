"""The CA bundles outgoing HTTPS verifies against are loaded once per process (lib/agentmesh/tls.py)
and are the ones httpx would load: SSL_CERT_FILE when set and the environment is trusted."""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi

from agentmesh.tls import httpx_context, system_context


def test_each_bundle_is_loaded_once_and_verifies_peers():
    context = httpx_context()
    assert httpx_context() is context and system_context() is system_context()
    for shared in (context, httpx_context(trust_env=False), system_context()):
        assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname


def test_ssl_cert_file_is_honoured_as_httpx_honours_it(monkeypatch, tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    default = httpx_context()
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    chosen = httpx_context()
    assert chosen is not default and httpx_context() is chosen
    # Not trusting the environment: certifi's bundle, whatever SSL_CERT_FILE says.
    assert httpx_context(trust_env=False) is httpx_context(trust_env=False) is not chosen
