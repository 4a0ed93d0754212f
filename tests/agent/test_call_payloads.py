"""A recorded model call's side is cut at its bound, and says so (loop/call_payloads.py)."""

from __future__ import annotations

import json

from agentmesh.agent.loop.call_payloads import bounded


def test_a_side_within_the_bound_is_its_json():
    text, cut = bounded({"text": "short"}, 1000)
    assert json.loads(text) == {"text": "short"} and not cut


def test_a_longer_side_is_cut_with_a_mark_and_its_full_length():
    side = {"messages": [{"role": "user", "content": "x" * 5000}]}
    text, cut = bounded(side, 1000)
    marked = json.loads(text)
    assert cut and marked["truncated"] is True
    assert marked["chars"] == len(json.dumps(side)) and len(marked["head"]) == 1000
    assert marked["head"] == json.dumps(side)[:1000]
