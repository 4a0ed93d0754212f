"""Asking an OpenAI-compatible server how large a model's context window is, for a model whose
catalogue entry names none. Best effort: any failure, or an answer without a window, is 0
(the agent then assumes AGENTMESH_AGENT_CONTEXT_WINDOW), and the agent asks once, at start-up.

- vLLM: `GET {base}/models` lists the model with `max_model_len`.
- llama.cpp's server: the same list, with `n_ctx` (or under `meta`), the context it serves.
- Ollama: `POST {server}/api/show {"model": ...}` — `num_ctx` in `parameters` when the model
  sets one, else `model_info`'s `<family>.context_length`. Ollama may serve a smaller context
  than that (its OLLAMA_CONTEXT_LENGTH default), which the API does not say: name the window in
  the catalogue for Ollama models.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

__all__ = ["probe_window"]

_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.MULTILINE)


def _positive(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def window_in_listing(listing: Any, model: str) -> int:
    """The window a `/models` answer gives for `model` (vLLM, llama.cpp); 0 when none."""
    entries = listing.get("data") if isinstance(listing, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("id") not in (model, None):
            continue
        meta = entry.get("meta")
        nested = meta.get("n_ctx") if isinstance(meta, dict) else None
        for value in (entry.get("max_model_len"), entry.get("n_ctx"), nested, entry.get("context_length")):
            if found := _positive(value):
                return found
    return 0


def window_in_show(show: Any) -> int:
    """The window an Ollama `/api/show` answer gives; 0 when none."""
    if not isinstance(show, dict):
        return 0
    found = _NUM_CTX.search(show.get("parameters") or "") if isinstance(show.get("parameters"), str) else None
    if found:
        return int(found.group(1))
    info = show.get("model_info")
    if not isinstance(info, dict):
        return 0
    return next((_positive(v) for k, v in info.items() if str(k).endswith(".context_length") and _positive(v)), 0)


async def probe_window(http: httpx.AsyncClient, base_url: str, model: str, api_key: str = "") -> int:
    """The model's context window as its server reports it; 0 when it says nothing or fails."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = base_url.rstrip("/")
    try:
        answer = await http.get(f"{base}/models", headers=headers)
        if answer.status_code == 200:
            found = window_in_listing(answer.json(), model)
            if found:
                return found
        # Ollama's own API sits beside its OpenAI-compatible /v1.
        server = base[: -len("/v1")] if base.endswith("/v1") else base
        answer = await http.post(f"{server}/api/show", json={"model": model}, headers=headers)
        if answer.status_code == 200:
            return window_in_show(answer.json())
    except (httpx.HTTPError, ValueError):
        pass  # best effort: the configured default stands
    return 0
