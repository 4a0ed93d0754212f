"""How a dataclass field says it holds a credential, apart from the configuration loader.

`agentmesh.config` finds such fields (`secret_values`) to keep their values out of logs, and
`agentmesh.models` declares one (a catalogue entry's key); both import this, so the model
catalogue need not import the configuration loader that reads it.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

__all__ = ["SECRET", "secret_field"]

SECRET = "agentmesh.config.secret"


def secret_field(default: str = "") -> Any:
    """A field holding a credential that no variable declares (a key read from the variable a
    file names): kept out of `repr`, and found by `config.secret_values` like a `secret=True` one."""
    return field(default=default, repr=False, metadata={SECRET: True})
