"""Masking the configured model keys in a reply that arrives in pieces (providers/redaction.py)."""

from __future__ import annotations

from agentmesh.agent.providers.redaction import StreamMask, keys_worth_masking

KEY = "sk-live-0123456789abcdef"
OTHER = "sk-other-key-42"


def streamed(text: str, size: int, keys: tuple[str, ...]) -> list[str]:
    mask = StreamMask(keys)
    return [mask.feed(text[i:i + size]) for i in range(0, len(text), size)] + [mask.flush()]


def test_no_piece_of_a_key_is_ever_shown_however_the_text_is_cut():
    keys = keys_worth_masking([KEY, OTHER, "x", ""])
    text = f"a {KEY} b {OTHER}{KEY} d"  # every "sk-" here starts a key
    for size in range(1, len(text) + 1):
        pieces = streamed(text, size, keys)
        assert "".join(pieces) == "a [redacted] b [redacted][redacted] d", size
        assert not any("s" in p.replace("[redacted]", "") for p in pieces), (size, pieces)


def test_what_only_looks_like_the_start_of_a_key_is_shown_once_it_is_not_one():
    keys = keys_worth_masking([KEY])
    for size in (1, 3, 7):
        assert "".join(streamed("ends with sk-live-01", size, keys)) == "ends with sk-live-01"
        assert "".join(streamed("sk-live-01 then more", size, keys)) == "sk-live-01 then more"


def test_short_placeholders_are_not_keys():
    assert keys_worth_masking(["x", "abc", "abcd"]) == ("abcd",)
    assert "".join(streamed("x marks abc", 2, keys_worth_masking(["x", "abc"]))) == "x marks abc"
