"""toolmaker: a function's signature to a JSON schema, from the syntax tree alone."""

from __future__ import annotations

import pytest

from agentmesh.agent.capabilities.toolmaker import ToolRefused, describe

SOURCE = '''
from typing import Literal, Optional

RAN = []


def rich(name: str, sizes: list[int], weights: dict[str, float], mode: Literal["a", "b"] = "a",
         note: Optional[str] = None, flag: bool | None = False) -> dict[str, int]:
    """Every kind of parameter a tool may take."""
    RAN.append(1)
    return {}

RAN.append("imported")  # would show if the module were run
'''


def test_every_supported_type_becomes_its_json_schema():
    made = describe(SOURCE, "rich")
    assert made.description == "Every kind of parameter a tool may take."
    assert made.parameters == {
        "type": "object", "additionalProperties": False, "required": ["name", "sizes", "weights"],
        "properties": {
            "name": {"type": "string"},
            "sizes": {"type": "array", "items": {"type": "integer"}},
            "weights": {"type": "object", "additionalProperties": {"type": "number"}},
            "mode": {"enum": ["a", "b"], "default": "a"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "flag": {"anyOf": [{"type": "boolean"}, {"type": "null"}], "default": False},
        },
    }


@pytest.mark.parametrize("source, says", [
    ("def f(x: int) -> int:\n    return x\n", "f has no docstring"),
    ("def f(x) -> int:\n    '''d'''\n", "f lacks type hints ('x')"),
    ("def f(x: int):\n    '''d'''\n", "f lacks type hints (the return value)"),
    ("def f(*xs: int) -> int:\n    '''d'''\n", "takes *args, **kwargs"),
    ("async def f() -> int:\n    '''d'''\n", "f is async"),
    ("def f(x: dict[int, str]) -> int:\n    '''d'''\n", "dictionary keys must be str"),
    ("def f(x: bytes) -> int:\n    '''d'''\n", "the type 'bytes' cannot be described as JSON"),
    ("def f(x: int = len('a')) -> int:\n    '''d'''\n", "its default must be a literal"),
    ("def f(x: int -> int:\n", "the file is not valid Python"),
])
def test_what_cannot_be_described_is_refused_with_a_reason(source, says):
    with pytest.raises(ToolRefused) as info:
        describe(source, "f")
    assert says in str(info.value)
